"""The AMPD coordinator (AMPD.md section 3): one replica, serving rounds with
the same policy objects the simulator uses. This file holds the parts together
and walks a round through them; each life cycle has its own room (the
reading order of a round, docs/SERVING.md "Components"):

| room | owns |
|---|---|
| ``rounds/`` | bind (``sessions``), route (``view_builder``, ``decode_batch``), a remote prefill (``remote``, ``dispatch``), deliver and recover (``delivery``, ``chat``), measure (``windows``, ``phases``) |
| ``upkeep/`` | idle sessions (``expiry``), the KV invariant and a store that restarted empty (``audit``), what a dead replica left in the queues (``dead_replicas``) |
| ``replica/`` | what the parts share (``context``), engine liveness (``health``), the decision log, Prometheus metrics |
| ``state/`` | the shared store (memory, Redis), its mirror, the prompt index |

When the store is unreachable a round is served locally on a replica-local
binding (degraded, no shared state).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator

from ampd.core.deployment import Role
from ampd.core.engine_kinds import PREFILL_SLOTS, READS_HISTORY
from ampd.core.task import PrefillTask
from ampd.core.view import ClusterView
from ampd.perf.interface import PerfModel
from ampd.policy.decisions import RouteDecision
from ampd.policy.reorder import QueuePolicy
from ampd.policy.routing import Router
from ampd.serve.upkeep.audit import ReservationAudit
from ampd.core.clock import ScaledClock
from ampd.serve.replica.context import CoordinatorOptions, ReplicaContext
from ampd.serve.replica.decision_log import DecisionLog
from ampd.serve.rounds.decode_batch import REPORT_MAX_AGE_S, DecodeBatches
from ampd.serve.rounds.delivery import RoundDelivery
from ampd.serve.rounds.dispatch import PrefillDispatcher
from ampd.engines.client import Chunk, EngineClient
from ampd.serve.upkeep.expiry import IdleExpiry
from ampd.serve.replica.health import EngineHealth
from ampd.serve.state.prompt_index import HistoryIndex, HistoryMatch
from ampd.serve.rounds.windows import LatencyWindows
from ampd.serve.state.mirror import StateMirror
from ampd.serve.rounds.remote import RemotePrefill
from ampd.serve.rounds.round import FROM_PROMPT, LiveRound, RoundRequest, RoundTrace, ServeError
from ampd.serve.rounds.sessions import SessionBook, need_tokens
from ampd.serve.state.store import SessionState, StateStore, StoreUnavailable, WorkerInfo, WorkerState
from ampd.serve.upkeep.dead_replicas import InflightSweep
from ampd.serve.rounds.view_builder import cluster_view

__all__ = ["Coordinator", "CoordinatorOptions"]


class Coordinator:
    """One coordinator replica.

    Args:
        workers: every engine (prefill and decode), ids 0..n-1.
        store: shared state (``MemoryStore`` for one process, ``RedisStore`` for several).
        perf: the cost model (``T_pre``, ``T_kv``, KV capacity per TP).
        router, queue_policy: the system's policies (``ampd.policy.systems``).
        clock: model time shared with the other replicas.
        options: see ``CoordinatorOptions``.
        decisions: where decisions are logged.
    """

    def __init__(self, workers: list[WorkerInfo], store: StateStore, perf: PerfModel, router: Router,
                 queue_policy: QueuePolicy, clock: ScaledClock, options: CoordinatorOptions,
                 decisions: DecisionLog | None = None) -> None:
        ctx = self.ctx = ReplicaContext({w.spec.worker_id: w for w in workers}, store, perf, clock, options,
                                        decisions or DecisionLog())
        self.router = router
        self.engines = EngineClient(stream_idle_timeout_s=clock.wall_s(options.stream_idle_timeout_s))
        self.health = EngineHealth(ctx, self.engines)
        prefill = {i: w for i, w in ctx.workers.items() if w.spec.role is Role.PREFILL}
        slots = {i: PREFILL_SLOTS[w.kind] for i, w in prefill.items()}
        self.dispatcher = PrefillDispatcher(store, self.engines, queue_policy, clock, options.replica_id, prefill,
                                            slots, options.kv_timeout_s, self.health.mark_dead,
                                            max(sum(ctx.perf.round_paths_s(w.spec.tp, w.spec.tp))
                                                for w in prefill.values()) if prefill else 0.0)
        self.mirror = StateMirror(store, sorted(ctx.workers), clock) if StateMirror.supported(store) else None
        self.sessions = SessionBook(ctx, self.health, self.view, self.mirror)
        self.histories = HistoryIndex(store, options.session_block_tokens)
        self.remote = RemotePrefill(ctx, self.dispatcher, self.mirror)
        self.windows = LatencyWindows(ctx)
        self.batches = DecodeBatches(ctx, options.itl_slack_threshold_s)
        self.delivery = RoundDelivery(ctx, self.engines, self.health, self.sessions, self.windows, self.batches)
        self.expiry = IdleExpiry(ctx, self.sessions)
        self.audit = ReservationAudit(ctx, self.sessions, self.health)
        self.sweep = InflightSweep(ctx, self.dispatcher, lambda: self._states(sorted(ctx.workers)))
        self.largest_kv_tokens = max(ctx.kv_capacity_tokens(i) for i, w in ctx.workers.items()
                                     if w.spec.role is Role.DECODE)
        self._active: set[str] = set()  # sessions with a round in progress on this replica
        self._background: list[asyncio.Task] = []

    # The parts the HTTP API and the tests read.
    workers = property(lambda self: self.ctx.workers)
    store = property(lambda self: self.ctx.store)
    options = property(lambda self: self.ctx.options)
    clock = property(lambda self: self.ctx.clock)
    decisions = property(lambda self: self.ctx.decisions)
    metrics = property(lambda self: self.ctx.metrics)
    store_ok = property(lambda self: self.ctx.store_ok)

    @property
    def dead_workers(self) -> frozenset[int]:
        """Workers this replica currently considers dead."""
        return frozenset(self.health.dead)

    # --- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Register the engines and start the background loops.

        Raises:
            ServeError: the store cannot be reached (503, naming it).
        """
        store = self.ctx.store
        try:
            await store.ping()
            await store.register_workers(list(self.ctx.workers.values()))
            await store.subscribe(self.ctx.options.replica_id, self.remote.on_result)
            if hasattr(store, "subscribe_owners"):  # other replicas exist only behind a shared store
                await store.subscribe_owners(self.sessions.forget)
            if self.mirror is not None:
                await self.mirror.start()
            self.audit.epoch = await store.epoch()
        except StoreUnavailable as err:
            raise ServeError(503, f"cannot start: {err}") from err
        for loop in (self.health.loop, self.sweep.loop, self.windows.flush_loop, self.batches.report_loop,
                     self.batches.drop_loop, self.expiry.loop, self.audit.loop, self.sessions.renew_loop):
            self._background.append(asyncio.create_task(loop()))

    async def stop(self) -> None:
        """Stop the loops and close connections."""
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self.mirror is not None:
            await self.mirror.stop()
        await self.dispatcher.close()
        await self.engines.close()
        await self.ctx.store.close()
        self.ctx.decisions.close()

    # --- one round --------------------------------------------------------------------------

    async def open_round(self, request: RoundRequest, scope: str = "") -> tuple[RoundTrace, AsyncIterator[Chunk]]:
        """Bind, route and prefill a round and wait for its first chunk; a
        request naming no session (``session_id`` "") continues the session its
        prompt extends, or starts a new one (``find_session``).

        Args:
            request: the round.
            scope: fingerprint of the client's API key ("" without keys): a
                session is served under the scope that created it only.

        Returns:
            The round's trace (complete up to the first token; its
            ``session_id`` the session served) and its chunks, the first included.

        Raises:
            ServeError: 400 (it can never fit), 403 (another key's session), 409
                (another round of the session runs), 503 (no KV room or no decode
                engine alive), an engine's 4xx, 502 (engines failed).
        """
        need = need_tokens(request)
        if need > self.largest_kv_tokens:  # before any lookup: a prompt this long is never served
            raise ServeError(400, f"prompt + max_tokens = {need} tokens of KV; the largest decode engine "
                                  f"holds {self.largest_kv_tokens}")
        if request.session_source != FROM_PROMPT:
            return await self._open(await self.verify_history(request, scope), scope)
        request = await self.find_session(request, scope)
        try:
            return await self._open(request, scope)
        except ServeError as err:
            if err.status != 409:
                raise
        # Its history is another conversation's too (their prompts were identical), and that
        # one's round is running: this conversation goes on as a new session.
        fresh = _continuing(request, HistoryMatch(new_session_id(), 0))
        self.ctx.decide("infer", {"session_id": fresh.session_id, "matched_tokens": 0,
                                  "prompt_tokens": len(request.prompt), "busy": request.session_id})
        return await self._open(fresh, scope)

    async def find_session(self, request: RoundRequest, scope: str) -> RoundRequest:
        """``request`` with the session its prompt extends the furthest
        (``HistoryIndex.find``), or a new session's id; the choice is logged
        (``infer``). Without the store every such request is a new session."""
        try:
            match = await self.histories.find(request.prompt, scope)
        except StoreUnavailable as err:
            self.ctx.store_failed(err)
            match = None
        if match is None:
            match = HistoryMatch(new_session_id(), 0)
        self.ctx.decide("infer", {"session_id": match.session_id, "matched_tokens": match.matched_tokens,
                                  "prompt_tokens": len(request.prompt), "diverged": match.diverged})
        return _continuing(request, match)

    async def verify_history(self, request: RoundRequest, scope: str) -> RoundRequest:
        """``request`` (a session the client named) with the history its prompt
        is verified to extend: the longest of the session's filed rounds
        (``HistoryIndex.find`` in the session's own index scope). A prompt that
        extends an earlier round than the latest (an edited turn, reasoning
        left out) is logged (``history``, ``diverged``) and counts only that
        round's history as held; one that extends no filed round (none filed:
        a first round, prompts under one block, a store that failed) is taken
        to extend all the decode engine holds."""
        try:
            match = await self.histories.find(request.prompt, _index_scope(request, scope))
        except StoreUnavailable as err:
            self.ctx.store_failed(err)
            return request
        if match is None:
            return request
        if match.diverged:
            self.ctx.decide("history", {"session_id": request.session_id, "matched_tokens": match.matched_tokens,
                                        "prompt_tokens": len(request.prompt), "diverged": True})
        return _continuing(request, match)

    async def _open(self, request: RoundRequest, scope: str) -> tuple[RoundTrace, AsyncIterator[Chunk]]:
        if request.session_id in self._active:
            raise ServeError(409, f"session {request.session_id}: a round is already in progress; send the next "
                                  "round after this one's last token", retry_after_s=1.0)
        trace = RoundTrace(request.session_id)
        chunks = self._round(request, scope, trace)
        try:
            first = await anext(chunks)
        except StopAsyncIteration:
            raise ServeError(502, "the engine streamed no token") from None
        return trace, _prepend(first, chunks)

    async def _round(self, request: RoundRequest, scope: str, trace: RoundTrace) -> AsyncIterator[Chunk]:
        """The round from binding to its last chunk; whatever ends it early (an
        error, a client that leaves) gives back what it took."""
        session_id = request.session_id
        self._active.add(session_id)
        done = False
        try:
            try:
                live = await self._prepare(request, scope, trace)
            except StoreUnavailable as err:
                self.ctx.store_failed(err)
                live = self._prepare_degraded(request, scope, trace)
            output: list[int] = []
            async for chunk in self.delivery.deliver(live):
                output.extend(chunk.token_ids)
                yield chunk
            self.ctx.metrics.rounds.labels("local" if trace.local else "remote").inc()
            # What the engine holds now: the prompt and the output it generated (a reply may
            # end before max_tokens: a chat server's end of turn, a finished tool call).
            finishing = self.sessions.finish(session_id, trace.decode_worker, len(request.prompt) + len(output),
                                             request.last_round, self.batches.slack_after(live))
            if request.last_round:
                await finishing
            else:  # two store round trips at once: the client's [DONE] waits for both
                await asyncio.gather(finishing, self.ctx.store_call(self.histories.record(
                    session_id, _index_scope(request, scope), request.prompt, output, trace.round_index,
                    request.branch_round)))
            done = True
        except ServeError as err:
            self.ctx.metrics.round_failures.labels("client" if err.status < 500 else "server").inc()
            raise
        except (GeneratorExit, asyncio.CancelledError):
            self.ctx.metrics.round_failures.labels("disconnect").inc()
            raise
        finally:
            try:
                if not done:  # shielded: a client that left cancels this task again while it gives back
                    await asyncio.shield(self.sessions.give_back(session_id))
            finally:
                self._active.discard(session_id)

    async def _prepare(self, request: RoundRequest, scope: str, trace: RoundTrace) -> LiveRound:
        now_s = self.ctx.clock.now_s()
        trace.ready_s = now_s
        state = await self.sessions.begin(request, scope, now_s)
        started = time.perf_counter()
        view = await self.view(self.routing_ids(state.decode_worker))
        if state.decode_worker in self.health.dead or state.decode_worker not in {w.worker_id for w in view.workers}:
            self.health.dead.add(state.decode_worker)
            state = await self.sessions.rebind(request.session_id, need_tokens(request))
            view = await self.view(self.routing_ids(state.decode_worker))
        live = self._live(request, state, trace, now_s)
        decision = self._route(live.task, view)
        self.ctx.metrics.decision.observe(time.perf_counter() - started)
        trace.routed_s = self.ctx.clock.now_s()
        self.ctx.decide("route", decision)
        if not decision.local:
            await self.remote.run(live, view, decision.worker_id)
        self.ctx.store_ok = True
        return live

    def _prepare_degraded(self, request: RoundRequest, scope: str, trace: RoundTrace) -> LiveRound:
        """Serve without the store: a local prefill on the session's decode worker
        as this replica knows it (its round may have begun before the store failed)."""
        now_s = self.ctx.clock.now_s()
        opened = self.sessions.rounds.get(request.session_id)
        if opened is None:
            state = self.sessions.begin_degraded(request, scope, now_s)
        elif opened.state.decode_worker in self.health.dead:
            state = self.sessions.move_degraded(request.session_id)
        else:
            state = opened.state
        # Whatever the store-backed attempt stamped (a remote prefill begun) is void now.
        trace.ready_s, trace.degraded, trace.local = now_s, True, True
        trace.routed_s = trace.kv_ready_s = None
        trace.remote_phases_s = {}
        return self._live(request, state, trace, now_s)

    @staticmethod
    def _live(request: RoundRequest, state: SessionState, trace: RoundTrace, now_s: float) -> LiveRound:
        """The round's prefill task (what the decode worker holds of the prompt is
        history), with ``trace`` placed on its decode worker, local until routed."""
        prompt_tokens = len(request.prompt)
        held_tokens = state.held_tokens if request.matched_tokens is None else min(state.held_tokens,
                                                                                 request.matched_tokens)
        hist_tokens = min(held_tokens, prompt_tokens - 1)
        task = PrefillTask(request.session_id, state.num_rounds - 1, hist_tokens, prompt_tokens - hist_tokens, now_s,
                           state.decode_worker)
        trace.round_index, trace.hist_tokens = task.round_index, hist_tokens
        trace.decode_worker = trace.prefill_worker = task.decode_worker
        return LiveRound(request, task, trace, state)

    def _route(self, task: PrefillTask, view: ClusterView) -> RouteDecision:
        try:
            return self.router.route(task, view, self.ctx.clock.now_s())
        except ValueError:  # no live prefill worker for a router that needs one
            return RouteDecision(task.session_id, task.round_index, task.decode_worker, True, "no-prefill-worker")

    async def view(self, worker_ids: list[int] | None = None) -> ClusterView:
        """The policies' snapshot of the live workers among ``worker_ids`` (default:
        all): from the replica's mirror of the store when it has one (no round
        trip), else from the store in one round trip."""
        states = await self._states(worker_ids if worker_ids is not None else sorted(self.ctx.workers))
        clock = self.ctx.clock
        return cluster_view(self.ctx.workers, states, self.ctx.perf, clock.now_s(), clock.model_s(REPORT_MAX_AGE_S))

    async def _states(self, worker_ids: list[int]) -> list[WorkerState]:
        """The workers' shared state: the mirror's copy, or (no mirror, or it is
        catching up after a gap) one read of the store.

        Raises:
            StoreUnavailable: it had to read the store, which did not answer.
        """
        states = self.mirror.states(worker_ids) if self.mirror is not None else None
        return states if states is not None else await self.ctx.store.snapshot(worker_ids, self.ctx.clock.now_s())

    def cached_tokens(self, trace: RoundTrace) -> int:
        """Prompt tokens of a finished round that no engine recomputed: the history
        its decode worker held, when prefilled there or on a prefill engine that
        reads the history KV (mock and ``vllm-nixl`` engines; a ``vllm`` prefill
        server recomputes it);
        0 after a rebind (the new decode worker held nothing)."""
        if trace.rebinds:
            return 0
        if trace.local or READS_HISTORY[self.ctx.workers[trace.prefill_worker].kind]:
            return trace.hist_tokens
        return 0

    def routing_ids(self, decode_worker: int) -> list[int]:
        """What a router reads: every prefill worker and the session's decode
        worker (not the other decode workers: half the state read on a balanced
        cluster, and the read is most of a routing decision's time)."""
        return sorted([*self.dispatcher.workers, decode_worker])


def new_session_id() -> str:
    """A fresh id for a session found from no history (``ampd-`` and 32 hex digits)."""
    return f"ampd-{uuid.uuid4().hex}"


async def _prepend(first: Chunk, rest: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    try:
        yield first
        async for chunk in rest:
            yield chunk
    finally:  # a client that leaves closes the round too (its session is free again)
        await rest.aclose()


def _continuing(request: RoundRequest, match: HistoryMatch) -> RoundRequest:
    """``request`` as a round of ``match``'s session holding its matched history
    (``branch_round``: the round a diverged prompt goes on from)."""
    return dataclasses.replace(request, session_id=match.session_id, matched_tokens=match.matched_tokens,
                               branch_round=match.round_index if match.diverged else None)


def _index_scope(request: RoundRequest, scope: str) -> str:
    """Where a round's history is filed and looked up: under the client's scope
    for sessions found from the prompt; under the session's own for a session
    the client named, so that it is verified against its own rounds only and
    a request naming no session never lands in it."""
    return scope if request.session_source == FROM_PROMPT else f"{scope}\x00{request.session_id}"

