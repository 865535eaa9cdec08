"""The simulated cluster: the coordinator's session life cycle (bind, route,
dispatch, tool waits) over simulated prefill and decode workers (AMPD.md section 3)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from ampd.core.deployment import Role, WorkerSpec
from ampd.core.errors import InputError
from ampd.core.session import Session
from ampd.core.task import PrefillTask
from ampd.core.view import ClusterView
from ampd.metrics.records import ItlSeries, RoundRecord, SessionRecord
from ampd.perf.interface import PerfModel
from ampd.policy.batching import Batching
from ampd.policy.binding import MostFreeKvBinder
from ampd.policy.decisions import BindDecision, RouteDecision
from ampd.policy.reorder import QueuePolicy
from ampd.policy.routing import Router
from ampd.sim.decode_worker import SimDecodeWorker
from ampd.sim.kv_cache import SessionKvCache
from ampd.core.limits import RunLimits
from ampd.sim.engine import EventLoop
from ampd.sim.prefill_worker import SimPrefillWorker


@dataclass
class SimResult:
    """Everything a simulation run produced.

    Attributes:
        sessions: one record per session that arrived, in arrival order.
        binds, routes: every decision, in the order taken.
        num_events: events the loop ran.
        end_s: virtual time of the last event.
        stopped: why the run stopped before its measured sessions all finished
            (``RunLimits``), or None.
    """

    sessions: list[SessionRecord]
    binds: list[BindDecision] = field(default_factory=list)
    routes: list[RouteDecision] = field(default_factory=list)
    num_events: int = 0
    end_s: float = 0.0
    stopped: str | None = None


@dataclass(frozen=True)
class WorkerOptions:
    """How the simulated workers behave, beyond the deployment and the policies.

    Attributes:
        window_s: sliding window of the TTFT/ITL statistics (AMPD.md section 3).
        batching: how decode workers mix prefills with decode steps.
        kv_retention: what happens to a session's KV during a tool call
            (``SessionKvCache``: resident, lru, pinned).
        pin_ttl_s: how long ``pinned`` keeps it.
        itl_slo_s: the ITL threshold decode workers measure their sessions'
            slack against (``WorkerView.min_itl_slack_s``), or None: not reported.
    """

    window_s: float = 10.0
    batching: Batching = Batching()
    kv_retention: str = "resident"
    pin_ttl_s: float = 0.0
    itl_slo_s: float | None = None


@dataclass(slots=True)
class _Live:
    session: Session
    record: SessionRecord
    decode_worker: int = -1


class SimCluster:
    """Workers of one deployment driven by one router, queue policy and binder.

    Sessions that no decode worker has memory for wait, in arrival order, until a
    session ends; their TTFT counts the wait. What a session's KV does during a
    tool call is the workers' ``kv_retention``; a round whose history was evicted
    recomputes it (``RoundRecord.recomputed_tokens``).

    Raises:
        InputError: a replica's GPUs cannot hold the model's weights.
    """

    def __init__(self, specs: tuple[WorkerSpec, ...], perf: PerfModel, router: Router,
                 queue_policy: QueuePolicy, options: WorkerOptions = WorkerOptions()) -> None:
        self.loop = EventLoop()
        self.perf, self.router, self.binder = perf, router, MostFreeKvBinder()
        self.specs = specs
        for spec in specs:
            if perf.kv_capacity_tokens(spec.tp) <= 0:
                raise InputError(f"worker {spec.worker_id} ({spec.role.value}, TP={spec.tp}): the model's weights "
                                 f"do not fit in {spec.tp} GPU(s) with room for KV cache")
        self.workers = [self._make_worker(s, queue_policy, options) for s in specs]
        self._prefill_by_server: dict[int, list[SimPrefillWorker]] = {}
        for worker in self.workers:
            if worker.spec.role is Role.PREFILL:
                self._prefill_by_server.setdefault(worker.spec.server, []).append(worker)
        self.result = SimResult(sessions=[])
        self._live: dict[str, _Live] = {}
        self._waiting: deque[_Live] = deque()
        self._arrivals: Iterator[Session] = iter(())
        self._limits: RunLimits | None = None
        self._measured_left = 0

    def _make_worker(self, spec: WorkerSpec, queue_policy: QueuePolicy, options: WorkerOptions):
        if spec.role is Role.DECODE:
            kv = SessionKvCache(self.perf.kv_capacity_tokens(spec.tp), options.kv_retention, options.pin_ttl_s)
            return SimDecodeWorker(spec, self.loop, self.perf, queue_policy, self, options.window_s,
                                   options.batching, kv, itl_slo_s=options.itl_slo_s,
                                   neighbours_busy=lambda: self._prefill_busy_on(spec.server))
        # Read at the prefill worker's TP for both ends: a profile that measured the engines'
        # requests measured one TP, and a deployment with another is refused.
        return SimPrefillWorker(spec, self.loop, self.perf, queue_policy, self, options.window_s,
                                lambda worker_id: self.specs[worker_id],
                                self.perf.round_paths_s(spec.tp, spec.tp).after_s)

    def _prefill_busy_on(self, server: int) -> Iterator[tuple[float, float]]:
        """The prefill engines' work in flight on ``server`` (a host: engines on it share
        its compute, ``ampd.sim.shared_host``)."""
        for worker in self._prefill_by_server.get(server, ()):
            busy = worker.engine_busy_s
            if busy is not None:
                yield busy

    def run(self, sessions: list[Session], limits: RunLimits | None = None) -> SimResult:
        """Simulate ``sessions``: to completion, or as ``limits`` say (the run ends
        when every measured session has finished, at ``stop_by_s``, or when the
        sessions in the system exceed ``max_in_system``). Arrivals are scheduled
        one at a time, so the event heap holds the sessions in the system only.

        Raises:
            InputError: two sessions share an id, or a session's KV (at its
                last round) exceeds what any decode replica holds, so it could
                never be served.
        """
        largest = max(w.kv_capacity_tokens for w in self.workers if w.spec.role is Role.DECODE)
        ordered = sorted(sessions, key=lambda s: s.arrival_s)
        seen: set[str] = set()
        for s in ordered:
            if s.session_id in seen:
                raise InputError(f"session id {s.session_id!r} appears twice; session ids must be unique")
            seen.add(s.session_id)
            if s.total_tokens > largest:
                raise InputError(f"session {s.session_id}: its KV reaches {s.total_tokens} tokens, "
                                 f"the largest decode replica holds {largest}")
        self._limits = limits
        self._measured_left = sum(limits.measured(s.arrival_s) for s in ordered) if limits else -1
        self._arrivals = iter(ordered)
        self._schedule_next_arrival()
        self.loop.run(limits.stop_by_s if limits else math.inf)
        if limits and self.result.stopped is None and self._measured_left > 0:
            self.result.stopped = (f"measured sessions still running {limits.stop_by_s - limits.measure_to_s:.0f} s "
                                   f"after the window")
        self.result.num_events, self.result.end_s = self.loop.num_events, self.loop.now_s
        return self.result

    def _schedule_next_arrival(self) -> None:
        session = next(self._arrivals, None)
        if session is not None:
            self.loop.at(session.arrival_s, self._arrive, session)

    def view(self) -> ClusterView:
        """The policies' snapshot of every worker now."""
        now_s = self.loop.now_s
        return ClusterView(tuple(w.view(now_s) for w in self.workers))

    def _arrive(self, session: Session) -> None:
        live = _Live(session, SessionRecord(session.session_id, session.arrival_s, len(session.rounds)))
        self.result.sessions.append(live.record)
        self._live[session.session_id] = live
        limits = self._limits
        if limits is not None and len(self._live) > limits.max_in_system:
            self.result.stopped = f"overloaded: more than {limits.max_in_system} sessions in the system"
            self.loop.stop()
            return
        self._schedule_next_arrival()
        self._waiting.append(live)
        self._admit()

    def _admit(self) -> None:
        while self._waiting:
            live = self._waiting[0]
            first = live.session.rounds[0]
            decision = self.binder.bind(live.session.session_id, first.input_tokens + first.output_tokens, self.view())
            if decision is None:
                return
            self._waiting.popleft()
            self.result.binds.append(decision)
            live.decode_worker = decision.worker_id
            self._start_round(live, 0, live.session.arrival_s)

    def _start_round(self, live: _Live, round_index: int, ready_s: float) -> None:
        session = live.session
        rnd = session.rounds[round_index]
        hist_tokens = session.history_tokens(round_index)
        cached = self.workers[live.decode_worker].kv.begin_round(
            session.session_id, hist_tokens, rnd.input_tokens + rnd.output_tokens, self.loop.now_s)
        task = PrefillTask(session.session_id, round_index, cached, rnd.input_tokens + hist_tokens - cached,
                           ready_s, live.decode_worker)
        live.record.rounds.append(RoundRecord(session.session_id, round_index, ready_s, task.hist_tokens,
                                              task.new_tokens, rnd.output_tokens, live.decode_worker,
                                              recomputed_tokens=hist_tokens - cached))
        decision = self.router.route(task, self.view(), self.loop.now_s)
        self.result.routes.append(decision)
        decode_tp = self.specs[live.decode_worker].tp
        prefill_tp = None if decision.local else self.specs[decision.worker_id].tp
        before_s = self.perf.round_paths_s(prefill_tp, decode_tp).before_s
        if before_s > 0:  # the request crosses the serving path to its engine
            self.loop.after(before_s, self._enqueue, task, decision)
        else:  # at once, so a catalog model's events keep their order
            self._enqueue(task, decision)

    def _enqueue(self, task: PrefillTask, decision: RouteDecision) -> None:
        target = self.workers[decision.worker_id]
        if decision.local:
            target.enqueue_local(task, decision.chunk_tokens)
        else:
            target.enqueue(task)

    def first_token(self, task: PrefillTask, prefill_worker: int, local: bool) -> None:
        live = self._live[task.session_id]
        record = live.record.rounds[task.round_index]
        record.first_token_s, record.local, record.prefill_worker = self.loop.now_s, local, prefill_worker
        self.workers[live.decode_worker].join(task, record.output_tokens)

    def round_done(self, session_id: str, round_index: int, itls: ItlSeries) -> None:
        live = self._live[session_id]
        record = live.record.rounds[round_index]
        record.done_s, record.itls_s = self.loop.now_s, itls
        rounds = live.session.rounds
        if round_index + 1 < len(rounds):
            ready_s = self.loop.now_s + rounds[round_index].tool_s
            self.loop.at(ready_s, self._start_round, live, round_index + 1, ready_s)
            return
        live.record.done_s = self.loop.now_s
        self.workers[live.decode_worker].end_session(session_id)
        del self._live[session_id]
        if self._limits is not None and self._limits.measured(live.session.arrival_s):
            self._measured_left -= 1
            if self._measured_left == 0:
                self.loop.stop()
                return
        self._admit()
