"""The KV reservation invariant, checked (docs/SERVING.md, "KV reservations"):
a decode worker's reserved KV in the store equals the sum of the reservations
of the sessions bound to it. The store's session operations keep it by
construction; every ``kv_audit_interval_s`` each replica recomputes the sums
in one store step, repairs any total that differs and counts it
(``ampd_kv_audit_repairs_total``), so a difference is seen and cannot last.

A store that restarted empty lost every binding: its epoch changes, and each
replica then gives back the bindings it knows (the sessions whose latest
round it served, ``SessionBook.known``) and its view of which engines are
dead, before the audit sums them."""

from __future__ import annotations

import asyncio

from ampd.serve.replica.context import ReplicaContext
from ampd.serve.replica.health import EngineHealth
from ampd.serve.rounds.sessions import SessionBook
from ampd.serve.state.store import StoreUnavailable


class ReservationAudit:
    """The periodic audit of one replica."""

    def __init__(self, ctx: ReplicaContext, sessions: SessionBook, health: EngineHealth) -> None:
        self.ctx, self.sessions, self.health = ctx, sessions, health
        self.epoch: str | None = None

    async def loop(self) -> None:
        while True:
            await asyncio.sleep(self.ctx.options.kv_audit_interval_s)
            try:
                await self.once()
            except StoreUnavailable as err:
                self.ctx.store_failed(err)

    async def once(self) -> dict[int, tuple[int, int]]:
        """Restore what a restarted store lost, then audit; ``{worker: (stored,
        derived)}`` of the totals repaired.

        Raises:
            StoreUnavailable: the store did not answer.
        """
        epoch = await self.ctx.store.epoch()
        if self.epoch is not None and epoch != self.epoch:
            restored = await self.sessions.restore()
            await self.health.reassert()
            self.ctx.metrics.sessions_restored.inc(len(restored))
            self.ctx.decide("restore", {"sessions": len(restored)})
        self.epoch = epoch
        totals = await self.ctx.store.audit_kv(self.ctx.decode_ids)
        metrics = self.ctx.metrics
        repaired = {w: t for w, t in totals.items() if t[0] != t[1]}
        for worker_id, (stored, derived) in totals.items():
            metrics.kv_reserved.labels(str(worker_id)).set(derived)
        for worker_id, (stored, derived) in repaired.items():
            metrics.kv_audit_repairs.labels(str(worker_id)).inc()
            metrics.kv_audit_repaired_tokens.inc(abs(stored - derived))
            self.ctx.decide("kv-repair", {"worker_id": worker_id, "stored_tokens": stored, "derived_tokens": derived})
        return repaired
