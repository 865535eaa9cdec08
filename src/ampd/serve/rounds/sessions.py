"""Session binding and KV reservation (AMPD.md section 3, step 1): the life of
a session's binding as one replica drives it, round by round.

A round holds a **lease** on its session in the store for as long as it runs
(``ROUND_LEASE_TTL_S``, renewed every ``ROUND_LEASE_RENEW_S``), so a session has
one round at a time across all replicas and idle expiry never ends a session
mid-round. Every change of a binding is one store operation that moves the
worker's KV total by the difference with the *stored* reservation
(``StateStore``), so the total is the sum over the worker's sessions by
construction; ``audit.py`` checks it. A round's end is written (its lease
released) before its client can see the round end, so a client's next round,
sent at once, is never 409: an end waits for a renewal in flight that carries
its lease (which would take the lease back), and one the store did not take is
written before the session's next round here starts.

A round's reservation: ``prompt + max_tokens`` tokens, grown into at its start
(never shrunk while the session lives: the engine keeps the history). When it
ends: ``held_tokens`` = that round's prompt + output; the last round drops the
binding; a round that fails gives back what it took (a first round leaves no
binding, a later one restores the reservation it found). docs/SERVING.md, "KV
reservations", says why each choice.

The replica also keeps what it last knew of the sessions it served
(``known``): the binding a store that restarted empty is given back
(``restore``), and the decode worker of a round served without the store.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import uuid
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ampd.core.deployment import Role
from ampd.core.view import ClusterView
from ampd.policy.binding import MostFreeKvBinder
from ampd.serve.replica.context import ROUND_LEASE_RENEW_S, ROUND_LEASE_TTL_S, ReplicaContext
from ampd.serve.replica.health import EngineHealth
from ampd.serve.state.mirror import StateMirror
from ampd.serve.rounds.round import RoundRequest, ServeError
from ampd.serve.state.store import BOUND, BUSY, DONE, FORBIDDEN, FULL, LOST, STARTED, SessionState

ADMISSION_POLL_S = 0.05  # model seconds between two looks for KV room


@dataclass
class OpenRound:
    """A round of a session in progress on this replica.

    Attributes:
        lease: its lease on the session in the store.
        before: the binding it found (None: it bound the session).
        state: the binding now (moved by a rebind).
        degraded: served without the store, which may hold a binding of it this
            replica never saw: only a last round writes to it (to drop it); the
            rest stays in ``known`` for a restore.
    """

    lease: str
    before: SessionState | None
    state: SessionState
    degraded: bool = False


def need_tokens(request: RoundRequest) -> int:
    """KV tokens a round may hold at its end: its prompt and its whole output."""
    return len(request.prompt) + request.max_tokens


class SessionBook:
    """Bindings and reservations of the sessions this replica serves rounds of.

    Args:
        ctx: the replica's shared parts.
        health: which engines are dead (never bound to).
        view: the policies' snapshot of every live worker (for the binder).
        mirror: the replica's mirror of the store (None without one), told of
            each binding chosen before the store has it.
    """

    def __init__(self, ctx: ReplicaContext, health: EngineHealth, view: Callable[[], Awaitable[ClusterView]],
                 mirror: StateMirror | None = None) -> None:
        self.ctx, self.health, self.view, self.mirror = ctx, health, view, mirror
        self.binder = MostFreeKvBinder()
        self.known: dict[str, SessionState] = {}
        self.rounds: dict[str, OpenRound] = {}
        self._unwritten: dict[str, tuple[str, SessionState | None, int]] = {}  # round ends to write again
        # The leases the renewal in flight carries, and its end (renew_loop, _write).
        self._renewing: frozenset[str] = frozenset()
        self._renewed = asyncio.Event()
        # A lease names this replica, this process (a restarted replica keeps its id; its leases
        # must not be taken for those of its previous life) and the round.
        self._lease_prefix = f"{ctx.options.replica_id}#{uuid.uuid4().hex[:12]}."
        self._leases = itertools.count()

    # --- a round's start ----------------------------------------------------------------------

    async def begin(self, request: RoundRequest, scope: str, now_s: float) -> SessionState:
        """Lease the session for this round and reserve its KV, binding it first
        when new; the binding with the round counted in.

        Raises:
            ServeError: 409 (another round of it runs, on any replica), 403 (it
                belongs to another API key), 503 (no decode worker has room
                within the admission timeout).
            StoreUnavailable: the store did not answer (nothing was taken).
        """
        session_id, lease = request.session_id, self._new_lease()
        unwritten = self._unwritten.pop(session_id, None)
        if unwritten is not None:  # its client has seen the round before end: its lease goes first
            await self._write(session_id, unwritten)
        need = need_tokens(request)
        while True:
            start = await self.ctx.store.start_round(session_id, scope, lease, ROUND_LEASE_TTL_S, need, now_s)
            if start.outcome == STARTED:
                return self._opened(session_id, OpenRound(lease, start.before, start.after))
            _refuse(session_id, start.outcome)
            state = await self._bind(session_id, scope, need, now_s, lease)
            if state is not None:
                return self._opened(session_id, OpenRound(lease, None, state))

    def begin_degraded(self, request: RoundRequest, scope: str, now_s: float) -> SessionState:
        """A round served without the store: on the decode worker this replica
        last saw the session on, or one chosen by a hash of its id.

        Raises:
            ServeError: 503 when no decode engine is alive; 403 for a session
                this replica knows under another API key.
        """
        session_id = request.session_id
        known = self.known.get(session_id)
        if known is not None and known.scope != scope:
            _refuse(session_id, FORBIDDEN)
        worker_id = self.degraded_worker(session_id)
        reserved = known.reserved_tokens if known is not None and known.decode_worker == worker_id else 0
        rounds = known.num_rounds if known is not None else 0
        state = SessionState(worker_id, 0, max(reserved, need_tokens(request)), rounds + 1, now_s, scope)
        return self._opened(session_id, OpenRound(self._new_lease(), known, state, degraded=True))

    def degraded_worker(self, session_id: str) -> int:
        """The live decode worker this replica last saw ``session_id`` on, else
        one chosen by a hash of its id (the same on every replica).

        Raises:
            ServeError: 503 when no decode engine is alive.
        """
        live = sorted(i for i, w in self.ctx.workers.items() if w.spec.role is Role.DECODE and i not in self.health.dead)
        if not live:
            raise ServeError(503, "no decode engine is alive")
        known = self.known.get(session_id)
        if known is not None and known.decode_worker in live:
            return known.decode_worker
        return live[zlib.crc32(session_id.encode("utf-8", "surrogatepass")) % len(live)]

    def _new_lease(self) -> str:
        return f"{self._lease_prefix}{next(self._leases)}"

    def _opened(self, session_id: str, opened: OpenRound) -> SessionState:
        self._unwritten.pop(session_id, None)  # this round read the binding as stored, and will write its own end
        self.rounds[session_id] = opened
        self.known[session_id] = opened.state
        return opened.state

    async def _bind(self, session_id: str, scope: str, need: int, now_s: float, lease: str) -> SessionState | None:
        """Bind a new session; None when another round bound it meanwhile (start
        it instead). A worker that filled up since it was chosen is chosen again,
        not overcommitted. The worker this replica last saw the session on (the
        store lost it) is tried first: its prefix cache may still hold the history."""
        known = self.known.get(session_id)
        preferred = known.decode_worker if known is not None else None
        while True:
            if preferred is not None and preferred not in self.health.dead:
                worker_id, preferred = preferred, None
                self.ctx.decide("rebind", {"session_id": session_id, "from_worker": None, "worker_id": worker_id,
                                           "reason": "binding missing from the store"})
            else:
                worker_id = await self._choose_decode(session_id, need)
            state = SessionState(worker_id, 0, need, 1, now_s, scope)
            outcome = await self.ctx.store.bind_session(session_id, state, self.ctx.kv_capacity_tokens(worker_id),
                                                        lease, ROUND_LEASE_TTL_S)
            if outcome == BOUND:
                return state
            if outcome != FULL:
                _refuse(session_id, outcome)
                return None

    async def _choose_decode(self, session_id: str, need: int) -> int:
        """A decode worker with room for ``need`` tokens, waiting for one up to
        the admission timeout (the simulator holds such sessions likewise)."""
        options = self.ctx.options
        deadline_s = self.ctx.clock.now_s() + options.admission_timeout_s
        while True:
            decision = self.binder.bind(session_id, need, await self.view())
            if decision is not None:
                self.ctx.decide("bind", decision)
                if self.mirror is not None:
                    self.mirror.note_reserved(decision.worker_id, need)
                return decision.worker_id
            if self.ctx.clock.now_s() >= deadline_s:
                raise ServeError(503, f"no live decode worker has KV room for {need} tokens after "
                                      f"{options.admission_timeout_s:g} s", retry_after_s=options.admission_timeout_s)
            await self.ctx.clock.sleep(ADMISSION_POLL_S)

    # --- during a round -----------------------------------------------------------------------

    async def rebind(self, session_id: str, need: int) -> SessionState:
        """Move the session of this replica's round off a dead decode worker (its
        history is then recomputed); the new binding.

        Raises:
            ServeError: 503 (no room), 409 (another round took the session).
            StoreUnavailable: the store did not answer.
        """
        opened = self.rounds[session_id]
        while True:
            worker_id = await self._choose_decode(session_id, need)
            moved = dataclasses.replace(opened.state, decode_worker=worker_id, held_tokens=0, reserved_tokens=need)
            outcome = await self.ctx.store.move_session(session_id, opened.lease, moved,
                                                        self.ctx.kv_capacity_tokens(worker_id), ROUND_LEASE_TTL_S)
            if outcome == DONE:
                break
            if outcome == LOST:
                _refuse(session_id, BUSY)
        self.ctx.metrics.rebinds.inc()
        self.ctx.decide("rebind", {"session_id": session_id, "from_worker": opened.state.decode_worker,
                                   "worker_id": worker_id})
        opened.state = self.known[session_id] = moved
        return moved

    def move_degraded(self, session_id: str) -> SessionState:
        """Move the session of this replica's round off a dead decode worker
        without the store; the new binding (this replica's alone).

        Raises:
            ServeError: 503 when no decode engine is alive.
        """
        opened = self.rounds[session_id]
        worker_id = self.degraded_worker(session_id)
        opened.state = self.known[session_id] = dataclasses.replace(opened.state, decode_worker=worker_id,
                                                                    held_tokens=0, reserved_tokens=0)
        return opened.state

    # --- a round's end ------------------------------------------------------------------------

    async def finish(self, session_id: str, decode_worker: int, held_tokens: int, last_round: bool,
                     itl_slack_s: float = 0.0) -> None:
        """The round delivered its output on ``decode_worker``: record what that
        worker now holds (``held_tokens``) and the session's ITL slack after it
        (``SessionState.itl_slack_s``), or drop the binding after the last round."""
        opened = self.rounds[session_id]
        state = opened.state
        reserved = state.reserved_tokens if state.decode_worker == decode_worker else 0
        done = dataclasses.replace(state, decode_worker=decode_worker, held_tokens=held_tokens,
                                   reserved_tokens=max(reserved, held_tokens), last_s=self.ctx.clock.now_s(),
                                   itl_slack_s=itl_slack_s)
        await self._close(session_id, None if last_round else done, write=last_round or not opened.degraded)

    async def give_back(self, session_id: str) -> None:
        """The round failed (engine refusal, engine failures, a client that left):
        give back what it took. A first round leaves no binding; a later one the
        reservation and history it found, or none on a worker it moved to."""
        opened = self.rounds.get(session_id)
        if opened is None:  # it failed before taking anything
            return
        before = opened.before
        if opened.degraded:
            await self._close(session_id, before, write=False)
            return
        if before is None:
            state = None
        elif opened.state.decode_worker == before.decode_worker:
            state = dataclasses.replace(opened.state, held_tokens=before.held_tokens,
                                        reserved_tokens=before.reserved_tokens, last_s=self.ctx.clock.now_s())
        else:
            state = dataclasses.replace(opened.state, held_tokens=0, reserved_tokens=0, last_s=self.ctx.clock.now_s())
        await self._close(session_id, state)

    async def _close(self, session_id: str, state: SessionState | None, write: bool = True) -> None:
        """Record the round's outcome (``write``: in the store too, releasing its
        lease; a write the store did not answer is tried again, see ``renew_loop``)."""
        opened = self.rounds.pop(session_id)
        if state is None:
            self.known.pop(session_id, None)
        else:
            self.known[session_id] = state
        if write:
            await self._write(session_id, (opened.lease, state, opened.state.num_rounds))

    async def _write(self, session_id: str, close: tuple[str, SessionState | None, int]) -> None:
        # A renewal takes back a lease it finds gone (StateStore.renew_leases): one sent before
        # this round ended but reaching the store after its end would hold the session for
        # ROUND_LEASE_TTL_S, and the client's next round would get 409. So the end waits for it.
        if close[0] in self._renewing:
            await self._renewed.wait()
        # Tried twice at once: a store call that timed out while this replica's event loop was
        # starved usually succeeds again at once, before its client is told the round is done.
        outcome = None
        for _ in range(2):
            outcome = await self.ctx.store_call(self.ctx.store.close_round(session_id, *close))
            if outcome is not None:
                break
        if outcome is None:
            self._unwritten[session_id] = close
        elif outcome == LOST:
            self.ctx.decide("lease-lost", {"session_id": session_id})

    # --- upkeep -------------------------------------------------------------------------------

    async def renew_loop(self) -> None:
        """Keep the leases of this replica's rounds alive (every ``ROUND_LEASE_RENEW_S``),
        and write the ends of rounds the store did not take (a timeout under load,
        an outage: else a binding would keep its round's reservation and lease
        until the idle TTL). A write repeated after its reply was lost is harmless
        (``StateStore.close_round``); one superseded by a later round of the
        session (begun here, or on another replica: ``forget``) is not written.
        A degraded round holds no lease: one written
        to a store that came back would outlive it and turn the next round away.
        A round that ends while a renewal carrying its lease is in flight writes
        its end once that renewal is done (``_write``)."""
        while True:
            await asyncio.sleep(ROUND_LEASE_RENEW_S)
            for session_id, close in list(self._unwritten.items()):
                if self._unwritten.get(session_id) is close:  # not replaced by a later round's meanwhile
                    del self._unwritten[session_id]
                    await self._write(session_id, close)
            leases = {sid: opened.lease for sid, opened in self.rounds.items() if not opened.degraded}
            self._renewing, self._renewed = frozenset(leases.values()), asyncio.Event()
            try:
                lost = await self.ctx.store_call(self.ctx.store.renew_leases(leases, ROUND_LEASE_TTL_S))
            finally:  # the rounds that ended meanwhile may write their ends now
                self._renewing = frozenset()
                self._renewed.set()
            for session_id in lost or ():
                self.ctx.decide("lease-lost", {"session_id": session_id})

    def forget(self, session_id: str, replica_id: str | None = None) -> None:
        """Another replica (``replica_id``) started a round of the session, or it
        ended: what this replica knew of it is no longer the latest."""
        if replica_id != self.ctx.options.replica_id and session_id not in self.rounds:
            self.known.pop(session_id, None)
            self._unwritten.pop(session_id, None)  # written late, it would undo the later round's end

    def prune(self, idle_before_s: float) -> None:
        """Forget sessions idle since before ``idle_before_s`` (expired by now)."""
        for session_id in [sid for sid, s in self.known.items() if s.last_s < idle_before_s]:
            self.forget(session_id)

    async def restore(self) -> list[str]:
        """Give the store back the bindings this replica knows (after it lost
        them); the ids written.

        Raises:
            StoreUnavailable: the store did not answer.
        """
        known = dict(self.known)
        written = await self.ctx.store.restore_sessions(known)
        # A round that ended its session while the restore was on its way dropped a binding the
        # restore then wrote back: drop it again (unless a round of it holds it now).
        for session_id in written:
            if session_id not in self.known:
                await self.ctx.store.close_round(session_id, self._new_lease(), None, known[session_id].num_rounds)
        return [sid for sid in written if sid in self.known]


def _refuse(session_id: str, outcome: str) -> None:
    """Raise the client's error for a session the store would not start."""
    if outcome == BUSY:
        raise ServeError(409, f"session {session_id}: a round is already in progress; send the next round after "
                              "this one's last token", retry_after_s=1.0)
    if outcome == FORBIDDEN:
        raise ServeError(403, f"session {session_id} belongs to another API key")


