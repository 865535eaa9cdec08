"""Idle sessions: a client that never says its last round leaves a binding
behind; every replica ends the sessions idle for ``session_idle_ttl_s`` (model
seconds) with no round leased, checking every tenth of that TTL. Ending is one
store step, so two replicas ending the same session end it once."""

from __future__ import annotations

from ampd.serve.replica.context import ReplicaContext
from ampd.serve.rounds.sessions import SessionBook
from ampd.serve.state.store import StoreUnavailable


class IdleExpiry:
    """The idle-session expiry of one replica."""

    def __init__(self, ctx: ReplicaContext, sessions: SessionBook) -> None:
        self.ctx, self.sessions = ctx, sessions

    async def loop(self) -> None:
        ttl_s = self.ctx.options.session_idle_ttl_s
        while True:
            await self.ctx.clock.sleep(ttl_s / 10)
            await self.once(self.ctx.clock.now_s() - ttl_s)

    async def once(self, idle_before_s: float) -> list[str]:
        """End the sessions idle since before ``idle_before_s``; their ids."""
        try:
            expired = await self.ctx.store.expire_sessions(idle_before_s)
        except StoreUnavailable as err:
            self.ctx.store_failed(err)
            return []
        for session_id in expired:
            self.sessions.forget(session_id)
            self.ctx.decide("expire", {"session_id": session_id})
        self.sessions.prune(idle_before_s)
        return expired
