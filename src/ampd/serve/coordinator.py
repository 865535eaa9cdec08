"""The AMPD coordinator (AMPD.md section 3): binds sessions to decode workers,
routes every prefill with the same policy objects the simulator uses, holds
the prefill queues (``PrefillDispatcher``), streams each round from its decode
engine, and measures the windowed TTFT/ITL the policies read. State shared
with other replicas lives in a ``StateStore``.

Failures (docs/SERVING.md, "Failures"): a remote prefill that fails or times
out, or whose KV the decode engine cannot load, is recomputed locally on the
decode engine; a decode engine that dies has its session rebound and the round
continued elsewhere (history recomputed); when the store is unreachable a round
is served locally on a replica-local binding (degraded, no shared state).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ampd.core.deployment import Role
from ampd.core.task import PrefillTask
from ampd.core.view import ClusterView, QueuedTask
from ampd.perf.interface import PerfModel
from ampd.policy.binding import MostFreeKvBinder
from ampd.policy.decisions import RouteDecision
from ampd.policy.reorder import QueuePolicy
from ampd.policy.routing import Router, remote_prefill_s
from ampd.serve.clock import ScaledClock
from ampd.serve.decision_log import DecisionLog
from ampd.serve.mirror import StateMirror
from ampd.serve.dispatch import PrefillDispatcher
from ampd.serve.engine_client import PREFILL_SLOTS, READS_HISTORY, Chunk, EngineClient, EngineError
from ampd.serve.prom import ServeMetrics
from ampd.serve.rounds import LiveRound, RoundRequest, RoundTrace, ServeError
from ampd.serve.store import (BOUND, TAKEN, QueueEntry, SessionState, StateStore, StoreUnavailable, WorkerInfo,
                              WorkerState)
from ampd.serve.view_builder import cluster_view

log = logging.getLogger(__name__)

ADMISSION_POLL_S = 0.05  # model seconds between two looks for KV room
# [our choice] A health check that fails this many times in a row marks an engine dead: one
# slow answer from a starved but live engine does not (a refused connection mid-round still
# marks it at once).
HEALTH_FAILURES_TO_DEAD = 3


@dataclass(frozen=True)
class CoordinatorOptions:
    """Knobs of one replica (``ServeConfig`` in ampd.config gives them).

    Attributes:
        replica_id: unique among the replicas sharing a store.
        model_name: the ``model`` field sent to the engines.
        kv_timeout_s: longest wait for a remote prefill (model s), then local recompute.
        admission_timeout_s: longest wait of a new session for KV room (model s).
        health_interval_s: engine health-check period, wall seconds.
        session_idle_ttl_s: a session idle this long (model s) is ended, for
            clients that never send ``X-Session-Last-Round``.
        stream_idle_timeout_s: a decode engine silent this long (model s) in
            the middle of a round counts as dead: the round moves on.
    """

    replica_id: str
    model_name: str
    kv_timeout_s: float = 30.0
    admission_timeout_s: float = 120.0
    health_interval_s: float = 1.0
    session_idle_ttl_s: float = 600.0
    stream_idle_timeout_s: float = 60.0


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
        self.workers = {w.spec.worker_id: w for w in workers}
        self.store, self.perf, self.router, self.clock, self.options = store, perf, router, clock, options
        self.binder = MostFreeKvBinder()
        self.engines = EngineClient(stream_idle_timeout_s=clock.wall_s(options.stream_idle_timeout_s))
        self.decisions = decisions or DecisionLog()
        self.metrics = ServeMetrics()
        prefill = {i: w for i, w in self.workers.items() if w.spec.role is Role.PREFILL}
        slots = {i: PREFILL_SLOTS[w.kind] for i, w in prefill.items()}
        self.dispatcher = PrefillDispatcher(store, self.engines, queue_policy, clock, options.replica_id, prefill,
                                            slots, options.kv_timeout_s, self.mark_dead)
        self.mirror = StateMirror(store, sorted(self.workers), clock) if StateMirror.supported(store) else None
        self._dead: set[int] = set()
        self._active: set[str] = set()  # sessions with a round in progress on this replica
        self._health_failures: dict[int, int] = {}
        self.largest_kv_tokens = max(perf.kv_capacity_tokens(w.spec.tp) for w in workers if w.spec.role is Role.DECODE)
        self._pending: dict[str, asyncio.Future] = {}
        self._bindings: dict[str, int] = {}  # replica-local mirror, for degraded service
        self._itl: dict[int, list[float]] = {}
        self._background: list[asyncio.Task] = []
        self.store_ok = True

    @property
    def dead_workers(self) -> frozenset[int]:
        """Workers this replica currently considers dead."""
        return frozenset(self._dead)

    # --- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Register the engines and start the background loops.

        Raises:
            ServeError: the store cannot be reached (503, naming it).
        """
        try:
            await self.store.ping()
            await self.store.register_workers(list(self.workers.values()))
            await self.store.subscribe(self.options.replica_id, self._on_result)
            if self.mirror is not None:
                await self.mirror.start()
        except StoreUnavailable as err:
            raise ServeError(503, f"cannot start: {err}") from err
        for loop in (self._health_loop, self._sweep_loop, self._flush_loop, self._expiry_loop):
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
        await self.store.close()
        self.decisions.close()

    # --- one round --------------------------------------------------------------------------

    async def open_round(self, request: RoundRequest) -> tuple[RoundTrace, AsyncIterator[Chunk]]:
        """Bind, route and prefill a round and wait for its first chunk.

        Returns:
            The round's trace (complete up to the first token) and its chunks,
            the first included.

        Raises:
            ServeError: nothing could serve it (503: no KV room or no decode
                engine alive; 502: an engine refused it).
        """
        need_tokens = len(request.prompt) + request.max_tokens
        if need_tokens > self.largest_kv_tokens:
            raise ServeError(400, f"prompt + max_tokens = {need_tokens} tokens of KV; the largest decode engine "
                                  f"holds {self.largest_kv_tokens}")
        if request.session_id in self._active:
            raise ServeError(409, f"session {request.session_id}: a round is already in progress; send the next "
                                  "round after this one's last token")
        trace = RoundTrace(request.session_id)
        chunks = self._round(request, trace)
        try:
            first = await anext(chunks)
        except StopAsyncIteration:
            raise ServeError(502, "the engine streamed no token") from None
        return trace, _prepend(first, chunks)

    async def _round(self, request: RoundRequest, trace: RoundTrace) -> AsyncIterator[Chunk]:
        self._active.add(request.session_id)
        try:
            try:
                live = await self._prepare(request, trace)
            except StoreUnavailable as err:
                self._store_failed(err)
                live = self._prepare_degraded(request, trace)
            async for chunk in self._deliver(live):
                yield chunk
            await self._finish(live)
        finally:
            self._active.discard(request.session_id)

    async def _prepare(self, request: RoundRequest, trace: RoundTrace) -> LiveRound:
        now_s = self.clock.now_s()
        trace.ready_s = now_s
        state = await self._session(request, now_s)
        started = time.perf_counter()
        view = await self.view(self.routing_ids(state.decode_worker))
        if state.decode_worker in self._dead or state.decode_worker not in {w.worker_id for w in view.workers}:
            self._dead.add(state.decode_worker)
            state = await self._rebind(request.session_id, state, len(request.prompt) + request.max_tokens)
            self._bindings[request.session_id] = state.decode_worker
            view = await self.view(self.routing_ids(state.decode_worker))
        task = _task(request, state, now_s)
        trace.round_index, trace.decode_worker = task.round_index, task.decode_worker
        live = LiveRound(request, task, trace, state)
        decision = self._route(task, view)
        self.metrics.decision.observe(time.perf_counter() - started)
        self.decisions.add("route", decision, replica=self.options.replica_id)
        if not decision.local:
            trace.local, trace.prefill_worker = False, decision.worker_id
            live.kv_params = await self._remote_prefill(live, view, decision.worker_id)
        else:
            trace.prefill_worker = task.decode_worker
        self.store_ok = True
        return live

    def _route(self, task: PrefillTask, view: ClusterView) -> RouteDecision:
        try:
            return self.router.route(task, view, self.clock.now_s())
        except ValueError:  # no live prefill worker for a router that needs one
            return RouteDecision(task.session_id, task.round_index, task.decode_worker, True, "no-prefill-worker")

    async def view(self, worker_ids: list[int] | None = None) -> ClusterView:
        """The policies' snapshot of the live workers among ``worker_ids`` (default:
        all): from the replica's mirror of the store when it has one (no round
        trip), else from the store in one round trip."""
        states = await self._states(worker_ids if worker_ids is not None else sorted(self.workers))
        return cluster_view(self.workers, states, self.perf, self.clock.now_s())

    async def _states(self, worker_ids: list[int]) -> list[WorkerState]:
        """The workers' shared state: the mirror's copy, or (no mirror, or it is
        catching up after a gap) one read of the store.

        Raises:
            StoreUnavailable: it had to read the store, which did not answer.
        """
        states = self.mirror.states(worker_ids) if self.mirror is not None else None
        return states if states is not None else await self.store.snapshot(worker_ids, self.clock.now_s())

    def routing_ids(self, decode_worker: int) -> list[int]:
        """What a router reads: every prefill worker and the session's decode
        worker (not the other decode workers: half the state read on a balanced
        cluster, and the read is most of a routing decision's time)."""
        return sorted([*self.dispatcher.workers, decode_worker])

    # --- sessions ---------------------------------------------------------------------------

    async def _session(self, request: RoundRequest, now_s: float) -> SessionState:
        """The session's binding with this round counted in and its KV reserved."""
        need_tokens = len(request.prompt) + request.max_tokens
        state = await self.store.get_session(request.session_id)
        if state is None:
            state = await self._bind(request.session_id, need_tokens, now_s, self._bindings.get(request.session_id))
        started = dataclasses.replace(state, reserved_tokens=max(state.reserved_tokens, need_tokens),
                                      num_rounds=state.num_rounds + 1, last_s=now_s)
        await self.store.update_session(request.session_id, state, started)
        self._bindings[request.session_id] = started.decode_worker
        return started

    async def _choose_decode(self, session_id: str, need_tokens: int) -> int:
        """A decode worker with room for ``need_tokens``, waiting for one up to
        the admission timeout (the simulator holds such sessions likewise)."""
        deadline_s = self.clock.now_s() + self.options.admission_timeout_s
        while True:
            decision = self.binder.bind(session_id, need_tokens, await self.view())
            if decision is not None:
                self.decisions.add("bind", decision, replica=self.options.replica_id)
                return decision.worker_id
            if self.clock.now_s() >= deadline_s:
                raise ServeError(503, f"session {session_id}: no live decode worker has KV room for "
                                      f"{need_tokens} tokens after {self.options.admission_timeout_s:g} s")
            await self.clock.sleep(ADMISSION_POLL_S)

    async def _bind(self, session_id: str, need_tokens: int, now_s: float, known: int | None = None) -> SessionState:
        """Bind a new session; a worker that filled up since it was chosen (another
        replica bound a session there meanwhile) is chosen again, not overcommitted.
        ``known``: the decode worker this replica last saw the session on (the
        store lost it, e.g. Redis restarted empty): tried first, since its prefix
        cache may still hold the history."""
        while True:
            if known is not None and known not in self._dead:
                worker_id, known = known, None
                self.decisions.add("rebind", {"session_id": session_id, "from_worker": None, "worker_id": worker_id,
                                              "reason": "binding missing from the store"},
                                   replica=self.options.replica_id)
            else:
                worker_id = await self._choose_decode(session_id, need_tokens)
            state = SessionState(worker_id, 0, need_tokens, 0, now_s)
            capacity_tokens = self.perf.kv_capacity_tokens(self.workers[worker_id].spec.tp)
            outcome = await self.store.bind_session(session_id, state, capacity_tokens)
            if outcome == BOUND:
                return state
            if outcome == TAKEN:
                return await self.store.get_session(session_id) or state

    async def _rebind(self, session_id: str, state: SessionState, need_tokens: int) -> SessionState:
        """Move a session off a dead decode worker; its history is recomputed."""
        worker_id = await self._choose_decode(session_id, need_tokens)
        moved = SessionState(worker_id, 0, need_tokens, state.num_rounds, state.last_s)
        await self.store.update_session(session_id, state, moved)
        self.metrics.rebinds.inc()
        self.decisions.add("rebind", {"session_id": session_id, "from_worker": state.decode_worker,
                                      "worker_id": worker_id}, replica=self.options.replica_id)
        return moved

    def _prepare_degraded(self, request: RoundRequest, trace: RoundTrace) -> LiveRound:
        """Serve without the store: local prefill on the session's known decode
        worker, or one chosen by a hash of its id."""
        live_decode = sorted(i for i, w in self.workers.items() if w.spec.role is Role.DECODE and i not in self._dead)
        if not live_decode:
            raise ServeError(503, "no decode engine is alive")
        worker_id = self._bindings.get(request.session_id)
        if worker_id not in live_decode:
            worker_id = live_decode[zlib.crc32(request.session_id.encode()) % len(live_decode)]
        self._bindings[request.session_id] = worker_id
        now_s = self.clock.now_s()
        task = PrefillTask(request.session_id, -1, 0, len(request.prompt), now_s, worker_id)
        trace.ready_s, trace.decode_worker, trace.prefill_worker, trace.degraded = now_s, worker_id, worker_id, True
        return LiveRound(request, task, trace, SessionState(worker_id))

    # --- remote prefill ---------------------------------------------------------------------

    async def _remote_prefill(self, live: LiveRound, view: ClusterView, worker_id: int) -> dict | None:
        """Queue the prefill on ``worker_id`` and wait for its KV; None (local
        recompute) when it fails or outlasts ``kv_timeout_s``."""
        task, prefill, decode = live.task, view.worker(worker_id), view.worker(live.task.decode_worker)
        now_s = self.clock.now_s()
        entry = QueueEntry(QueuedTask(task, now_s, remote_prefill_s(task, decode, prefill, self.perf)),
                           self.options.replica_id)
        body = self._engine_body(live.request, live.request.prompt, 1, stream=False)
        body["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False}
        if prefill.reads_history:  # an engine that reads the history KV is told where it lives
            body["kv_transfer_params"].update(ampd_hist_tokens=task.hist_tokens, ampd_decode_tp=decode.spec.tp,
                                              ampd_decode_server=decode.spec.server)
        result = asyncio.get_running_loop().create_future()
        self._pending[entry.key] = result
        try:
            await self.store.push(worker_id, entry, json.dumps(body))
            if self.mirror is not None:
                self.mirror.note_queued(worker_id, entry)
            await self.dispatcher.kick(worker_id)
            message = await asyncio.wait_for(result, self.clock.wall_s(self.options.kv_timeout_s))
        except TimeoutError:
            await self.store.withdraw(worker_id, entry)
            return self._fallback(live, "timeout")
        finally:
            self._pending.pop(entry.key, None)
        if not message["ok"]:
            reason = "timeout" if message.get("reason") == "timeout" else "prefill-failed"
            return self._fallback(live, reason, message.get("error"))
        return message.get("kv_transfer_params") or {}

    def _on_result(self, message: dict) -> None:
        result = self._pending.get(message.get("key"))
        if result is not None and not result.done():
            result.set_result(message)

    def _fallback(self, live: LiveRound, reason: str, detail: str | None = None) -> None:
        """Recompute the round locally on its decode worker instead."""
        self.metrics.fallbacks.labels(reason).inc()
        self.decisions.add("fallback", {"session_id": live.task.session_id, "round_index": live.task.round_index,
                                        "prefill_worker": live.trace.prefill_worker, "reason": reason,
                                        "detail": detail}, replica=self.options.replica_id)
        live.trace.fallback, live.trace.local = reason, True
        live.trace.prefill_worker, live.kv_params = live.trace.decode_worker, None
        return None

    # --- streaming --------------------------------------------------------------------------

    def _engine_body(self, request: RoundRequest, prompt: tuple[int, ...], max_tokens: int, stream: bool) -> dict:
        body = {**request.params, "model": self.options.model_name, "prompt": list(prompt),
                "max_tokens": max_tokens, "stream": stream, "return_token_ids": True}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    async def _deliver(self, live: LiveRound) -> AsyncIterator[Chunk]:
        """Stream the round from its decode engine; on a KV load failure recompute
        locally, on a dead engine rebind and continue after the tokens already sent."""
        emitted: list[int] = []
        for _ in range(len(self.workers) + 2):
            body = self._engine_body(live.request, live.request.prompt + tuple(emitted),
                                     live.request.max_tokens - len(emitted), stream=True)
            if live.kv_params is not None and not emitted:
                body["kv_transfer_params"] = live.kv_params
            try:
                async for chunk in self._stream_once(live, body, not emitted):
                    emitted.extend(chunk.token_ids)
                    yield chunk
                return
            except EngineError as err:
                await self._recover(live, err, emitted)
        raise ServeError(502, f"round {live.task.session_id}/{live.task.round_index}: engines kept failing")

    async def _stream_once(self, live: LiveRound, body: dict, first: bool) -> AsyncIterator[Chunk]:
        worker_id = live.trace.decode_worker
        local_key = None
        if first and live.trace.local and not live.trace.degraded:
            local_key = await self._track_local(live)
        try:
            async for chunk in self.engines.stream(self.workers[worker_id].url, body, live.task.session_id,
                                                   live.request.last_round):
                if chunk.token_ids:
                    if live.trace.first_token_s is None:
                        await self._first_token(live, len(chunk.token_ids))
                        if local_key is not None:  # the local prefill is done: out of the worker's queue
                            await self._store_call(self.store.remove_inflight(worker_id, local_key))
                            local_key = None
                    else:
                        self._later_tokens(live, len(chunk.token_ids))
                    yield chunk
                elif chunk.event.get("usage"):
                    live.usage = chunk.event["usage"]
        finally:
            if local_key is not None:
                await self._store_call(self.store.remove_inflight(worker_id, local_key))

    async def _track_local(self, live: LiveRound) -> str:
        """Count a local prefill in its decode worker's queue until its first token."""
        task = live.task
        cost_s = self.perf.prefill_s(task.hist_tokens, task.new_tokens, self.workers[task.decode_worker].spec.tp)
        entry = QueueEntry(QueuedTask(task, self.clock.now_s(), cost_s), self.options.replica_id)
        await self._store_call(self.store.add_inflight(live.trace.decode_worker, entry))
        return entry.key

    async def _recover(self, live: LiveRound, err: EngineError, emitted: list[int]) -> None:
        """Prepare the next attempt after ``err``, or raise when none can help."""
        if err.reason == "status" and live.kv_params is not None and not emitted:
            self._fallback(live, "kv-load-failed", err.message)
            return
        if not err.engine_down:
            client_error = err.status is not None and 400 <= err.status < 500
            raise ServeError(err.status if client_error else 502, str(err))
        await self.mark_dead(live.trace.decode_worker)
        need_tokens = len(live.request.prompt) + live.request.max_tokens
        try:
            live.state = await self._rebind(live.task.session_id, live.state, need_tokens)
        except StoreUnavailable as store_err:
            self._store_failed(store_err)
            self._prepare_degraded(live.request, live.trace)
            live.state = SessionState(live.trace.decode_worker)
        live.trace.decode_worker = live.trace.prefill_worker = live.state.decode_worker
        live.trace.local, live.kv_params = True, None
        live.trace.rebinds += 1
        self._bindings[live.task.session_id] = live.state.decode_worker

    async def _first_token(self, live: LiveRound, count: int) -> None:
        """The round's first chunk (it may carry several tokens: the ones after the
        first count as ITL gaps of 0)."""
        now_s = self.clock.now_s()
        trace = live.trace
        trace.first_token_s = trace.last_token_s = now_s
        trace.num_tokens = count
        if count > 1:
            self._itl.setdefault(trace.decode_worker, [0.0, 0])[1] += count - 1
        ttft_s = now_s - trace.ready_s
        self.metrics.ttft.observe(ttft_s)
        if not trace.local:
            await self._store_call(self.store.add_samples(trace.prefill_worker, "ttft", now_s, ttft_s, 1))

    def _later_tokens(self, live: LiveRound, count: int) -> None:
        now_s = self.clock.now_s()
        trace = live.trace
        gap_s = now_s - trace.last_token_s
        trace.last_token_s = now_s
        trace.num_tokens += count
        self.metrics.itl.observe(gap_s)
        sums = self._itl.setdefault(trace.decode_worker, [0.0, 0])
        sums[0] += gap_s  # a chunk of several tokens: one gap, then zeros
        sums[1] += count

    async def _finish(self, live: LiveRound) -> None:
        """Record what the decode worker now holds; release the session at its end."""
        trace = live.trace
        self.metrics.rounds.labels("local" if trace.local else "remote").inc()
        if trace.degraded:
            return
        held_tokens = len(live.request.prompt) + live.request.max_tokens
        done = dataclasses.replace(live.state, held_tokens=held_tokens, last_s=self.clock.now_s(),
                                   reserved_tokens=max(live.state.reserved_tokens, held_tokens))
        await self._store_call(self.store.update_session(live.task.session_id, live.state, done))
        if live.request.last_round:
            await self._store_call(self.store.end_session(live.task.session_id))
            self._bindings.pop(live.task.session_id, None)

    # --- health and background --------------------------------------------------------------

    async def mark_dead(self, worker_id: int) -> None:
        """Stop using an engine until its health check answers again."""
        if worker_id not in self._dead:
            log.warning("worker %d (%s) marked dead", worker_id, self.workers[worker_id].url)
            self.decisions.add("dead", {"worker_id": worker_id}, replica=self.options.replica_id)
        self._dead.add(worker_id)
        self.metrics.worker_up.labels(str(worker_id)).set(0)
        await self._store_call(self.store.set_alive(worker_id, False))

    async def _health_loop(self) -> None:
        while True:
            for worker_id, info in self.workers.items():
                up = await self.engines.health(info.url)
                failures = self._health_failures[worker_id] = 0 if up else self._health_failures.get(worker_id, 0) + 1
                self.metrics.worker_up.labels(str(worker_id)).set(int(up))
                if up and worker_id in self._dead:
                    self._dead.discard(worker_id)
                    await self._store_call(self.store.set_alive(worker_id, True))
                elif failures >= HEALTH_FAILURES_TO_DEAD and worker_id not in self._dead:
                    await self.mark_dead(worker_id)
            await asyncio.sleep(self.options.health_interval_s)

    async def _sweep_loop(self) -> None:
        """Now and then: drop in-flight entries nobody will finish, and look at
        every prefill queue. Both cover a replica that died (holding a queue's
        lease, or with prefills in flight whose slots would stay taken)."""
        while True:
            await asyncio.sleep(0.5)
            try:
                states = await self._states(sorted(self.workers))
                await self._drop_stale_inflight(states)
            except StoreUnavailable as err:
                self._store_failed(err)
                continue
            for state in states:
                if state.worker_id in self.dispatcher.workers and state.queue:
                    await self.dispatcher.kick(state.worker_id)

    async def _drop_stale_inflight(self, states: list[WorkerState]) -> None:
        """An in-flight entry older than twice the longest wait any replica allows
        (``kv_timeout_s``, ``stream_idle_timeout_s``) has no owner waiting for it."""
        now_s = self.clock.now_s()
        stale_s = 2 * max(self.options.kv_timeout_s, self.options.stream_idle_timeout_s)
        for state in states:
            for entry in state.inflight:
                since_s = entry.dispatch_s if entry.dispatch_s is not None else entry.queued.enqueue_s
                if now_s - since_s > stale_s:
                    await self.store.remove_inflight(state.worker_id, entry.key)
                    self.decisions.add("stale", {"worker_id": state.worker_id, "task": entry.key},
                                       replica=self.options.replica_id)

    async def _flush_loop(self) -> None:
        """Write the ITL samples gathered since the last flush (one store call per
        decode worker, not one per token)."""
        while True:
            await asyncio.sleep(0.1)
            now_s = self.clock.now_s()
            pending, self._itl = self._itl, {}
            for worker_id, (total_s, count) in pending.items():
                await self._store_call(self.store.add_samples(worker_id, "itl", now_s, total_s, count))

    async def _expiry_loop(self) -> None:
        """End idle sessions (every replica may: ending one is idempotent)."""
        while True:
            await self.clock.sleep(self.options.session_idle_ttl_s / 10)
            try:
                expired = await self.store.expire_sessions(self.clock.now_s() - self.options.session_idle_ttl_s)
            except StoreUnavailable as err:
                self._store_failed(err)
                continue
            for session_id in expired:
                self._bindings.pop(session_id, None)
                self.decisions.add("expire", {"session_id": session_id}, replica=self.options.replica_id)

    async def _store_call(self, coro) -> None:
        """Run a store update whose loss only degrades statistics."""
        try:
            await coro
            self.store_ok = True
        except StoreUnavailable as err:
            self._store_failed(err)

    def _store_failed(self, err: StoreUnavailable) -> None:
        self.store_ok = False
        self.metrics.store_errors.inc()
        log.warning("shared store unavailable, serving degraded: %s", err)


def _task(request: RoundRequest, state: SessionState, now_s: float) -> PrefillTask:
    """The round's prefill: what the decode worker holds of the prompt is history."""
    prompt_tokens = len(request.prompt)
    hist_tokens = min(state.held_tokens, prompt_tokens - 1)
    return PrefillTask(request.session_id, state.num_rounds - 1, hist_tokens, prompt_tokens - hist_tokens, now_s,
                       state.decode_worker)


async def _prepend(first: Chunk, rest: AsyncIterator[Chunk]) -> AsyncIterator[Chunk]:
    try:
        yield first
        async for chunk in rest:
            yield chunk
    finally:  # a client that leaves closes the round too (its session is free again)
        await rest.aclose()
