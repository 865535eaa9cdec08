"""Prefill routing: local on the bound decode worker, or remote on a prefill
worker (AMPD.md section 3.1)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from ampd.core.task import PrefillTask
from ampd.core.view import ClusterView, WorkerView
from ampd.perf.interface import PerfModel
from ampd.policy.batching import Batching, local_prefill
from ampd.policy.decisions import RouteDecision


class Router(Protocol):
    """Decides where every prefill, initial or incremental, runs. Called by the
    runtime once per round, when the round's input is available."""

    def route(self, task: PrefillTask, view: ClusterView, now_s: float) -> RouteDecision: ...


@dataclass(frozen=True, slots=True)
class SloThresholds:
    """Per-session SLO thresholds (AMPD.md section 1), seconds."""

    ttft_s: float
    itl_s: float

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.itl_s > 0):
            raise ValueError(f"SLO thresholds must be > 0: ttft_s={self.ttft_s}, itl_s={self.itl_s}")


def remote_prefill_s(task: PrefillTask, decode: WorkerView, prefill: WorkerView, perf: PerfModel) -> float:
    """Time a remote prefill occupies ``prefill`` and its links, seconds: read the
    history KV from the decode worker, prefill the new tokens, send their KV
    back (``perf.remote_stages_s``: as measured where a profile timed the
    engines' own requests). An engine that does not read history (``reads_history`` False)
    recomputes it instead and sends the whole prompt's KV back (DESIGN.md
    section 5: the cost model charges what the engine really does)."""
    if prefill.reads_history:
        return sum(perf.remote_stages_s(task.hist_tokens, task.new_tokens, prefill.spec, decode.spec))
    prompt_tokens = task.hist_tokens + task.new_tokens
    return perf.prefill_s(0, prompt_tokens, prefill.spec.tp) + perf.kv_transfer_s(prompt_tokens, prefill.spec,
                                                                                    decode.spec)


def remote_estimate_s(task: PrefillTask, decode: WorkerView, prefill: WorkerView, perf: PerfModel) -> float:
    """``t_remote_i`` of Algorithm 1: drain the prefill worker's queue, then
    ``remote_prefill_s``, plus the round's serving path (``perf.round_paths_s``: its
    two engine requests' in the paper's model, 0 in a catalog model; what the serving
    stack adds, where measured; engines that recompute history are timed by a perf
    model without measured requests, ``ampd.run.resolve.perf_model_for``, so their
    round makes two). [our choice] The path before the queue is counted
    after the drain: so it runs when served (the coordinator holds the queue); the
    simulator spends it before the queue, where it overlaps a draining queue and the
    estimate runs high by up to that path."""
    paths_s = sum(perf.round_paths_s(prefill.spec.tp, decode.spec.tp))
    return prefill.queue_drain_s + remote_prefill_s(task, decode, prefill, perf) + paths_s


def local_estimate_s(task: PrefillTask, decode: WorkerView, perf: PerfModel,
                     batching: Batching = Batching()) -> float:
    """``t_local`` of Algorithm 1: the task plus every prefill already queued on
    the decode worker (the paper's formula leaves out the decode step in flight).

    Each prefill takes what ``batching`` makes of it on the worker's batch
    (``ampd.policy.batching.local_prefill``): ``T_pre`` alone when the engine
    pauses the batch (the paper's formula, queued tasks at their ``cost_s``); the
    sum of its mixed steps when it prefills in chunks, queued tasks included.
    Plus the round's serving path (``perf.round_paths_s``: its one engine request's,
    and the serving stack's where measured)."""
    tp = decode.spec.tp
    path_s = perf.round_paths_s(None, tp).before_s

    def ttft_s(t: PrefillTask) -> float:
        return local_prefill(perf, tp, batching, t.hist_tokens, t.new_tokens, decode.batch_size,
                             decode.context_tokens).ttft_s

    if batching.chunked:
        return ttft_s(task) + sum(ttft_s(q.task) for q in decode.queue) + path_s
    return ttft_s(task) + sum(q.cost_s for q in decode.queue) + path_s


class AdaptiveRouter:
    """AMPD's adaptive routing, Algorithm 1.

    1. Visit prefill workers in random order; the first whose windowed TTFT is
       at most ``alpha`` x TTFT threshold takes the task.
    2. Else, if the bound decode worker's windowed ITL is at most ``beta`` x ITL
       threshold, run it locally.
    3. Else take the option with the smallest predicted completion time.

    A worker that finished nothing in the window reads 0 (idle), as a window
    average does; ties in step 3 go to local, then to the lowest worker id.

    Args:
        perf: cost functions (``T_pre``, ``T_kv``).
        slo: the thresholds.
        rng: seeded generator for the visiting order (avoids herding).
        alpha, beta: slack factors, paper defaults 0.9 and 0.85.
        batching: how the decode workers' engine runs a local prefill
            (``t_local``, ``local_estimate_s``); default the paper's pause.
    """

    def __init__(self, perf: PerfModel, slo: SloThresholds, rng: random.Random,
                 alpha: float = 0.9, beta: float = 0.85, batching: Batching = Batching()) -> None:
        self.perf, self.slo, self.rng = perf, slo, rng
        self.alpha, self.beta, self.batching = alpha, beta, batching

    def route(self, task: PrefillTask, view: ClusterView, now_s: float) -> RouteDecision:
        decode = view.worker(task.decode_worker)
        prefills = list(view.prefill_workers)
        self.rng.shuffle(prefills)
        for w in prefills:
            ttft_s = w.windowed_ttft_s or 0.0
            if ttft_s <= self.alpha * self.slo.ttft_s:
                return RouteDecision(task.session_id, task.round_index, w.worker_id, False, "prefill-window", ttft_s)
        return self._local_or_estimate(task, decode, sorted(prefills, key=lambda w: w.worker_id))

    def _local_or_estimate(self, task: PrefillTask, decode: WorkerView, prefills: list[WorkerView]) -> RouteDecision:
        """Steps 2 and 3."""
        itl_s = decode.windowed_itl_s or 0.0
        if itl_s <= self.beta * self.slo.itl_s:
            return RouteDecision(task.session_id, task.round_index, decode.worker_id, True, "decode-window", itl_s)
        return self._by_estimate(task, decode, prefills)

    def _by_estimate(self, task: PrefillTask, decode: WorkerView, prefills: list[WorkerView]) -> RouteDecision:
        options = [(decode.worker_id, local_estimate_s(task, decode, self.perf, self.batching))]
        options += [(w.worker_id, remote_estimate_s(task, decode, w, self.perf)) for w in prefills]
        worker_id, best_s = min(options, key=lambda o: o[1])
        return RouteDecision(task.session_id, task.round_index, worker_id, worker_id == decode.worker_id,
                             "estimate", best_s, tuple(options))


class PredictiveRouter(AdaptiveRouter):
    """AMPD's Algorithm 1 with a load signal that sees queues: **not the paper's**
    (system ``ampd-predictive``).

    Step 1 reads, instead of each prefill worker's windowed TTFT, the TTFT the task
    would get there (time already waited + ``t_remote_i``), and takes the worker
    with the smallest one if it is at most ``alpha`` x threshold. A window average
    reads "fine" for a worker whose queue has grown but which has finished nothing
    slow yet, so random visits herd onto it (AMPD.md section 5); the prediction
    does not lag. Steps 2 and 3 are the paper's.
    """

    def route(self, task: PrefillTask, view: ClusterView, now_s: float) -> RouteDecision:
        decode = view.worker(task.decode_worker)
        prefills = sorted(view.prefill_workers, key=lambda w: w.worker_id)
        waited_s = now_s - task.ready_s
        if prefills:
            best_s, best = min((waited_s + remote_estimate_s(task, decode, w, self.perf), w.worker_id)
                               for w in prefills)
            if best_s <= self.alpha * self.slo.ttft_s:
                return RouteDecision(task.session_id, task.round_index, best, False, "prefill-predicted", best_s)
        return self._local_or_estimate(task, decode, prefills)


def least_loaded_prefill(view: ClusterView) -> WorkerView:
    """The prefill worker with the least queued work (ties: lowest id): where a
    shared prefill queue, as Dynamo's prefill workers pull from, would run a task.

    Raises:
        ValueError: the deployment has no prefill worker.
    """
    prefills = view.prefill_workers
    if not prefills:
        raise ValueError("this routing needs at least one prefill worker")
    return min(prefills, key=lambda w: (w.queue_drain_s, w.worker_id))


class AlwaysRemoteRouter:
    """Plain PD disaggregation (Dynamo's default): every prefill goes to the least
    loaded prefill worker."""

    def route(self, task: PrefillTask, view: ClusterView, now_s: float) -> RouteDecision:
        best = least_loaded_prefill(view)
        return RouteDecision(task.session_id, task.round_index, best.worker_id, False, "always-remote",
                             best.queue_drain_s)


class AlwaysLocalRouter:
    """Colocated serving (vLLM): every prefill runs on the replica the session is
    bound to, which holds its prefix cache."""

    def route(self, task: PrefillTask, view: ClusterView, now_s: float) -> RouteDecision:
        return RouteDecision(task.session_id, task.round_index, task.decode_worker, True, "colocated")


class ThresholdRouter:
    """Dynamo's conditional disaggregation (AMPD.md section 5): fixed rules decide
    local or remote; remote goes to the least loaded prefill worker.

    Rules (either may be switched off; local when any enabled rule holds):
      * ``length``: the uncached prefill (the new tokens: the history is cached on
        the decode worker) is under ``max_local_prefill_tokens`` (2048) and its
        share of the whole prompt under ``max_uncached_ratio`` (0.7);
      * ``busy``: the least loaded prefill worker already has
        ``busy_queue_tasks`` (2) or more tasks waiting. [our choice] Dynamo
        compares its prefill queue's length with ``max_prefill_queue_size``; 2
        waiting tasks is our reading of "busy".
    """

    def __init__(self, length_rule: bool = True, busy_rule: bool = False, max_local_prefill_tokens: int = 2048,
                 max_uncached_ratio: float = 0.7, busy_queue_tasks: int = 2) -> None:
        if not (length_rule or busy_rule):
            raise ValueError("threshold routing needs the length rule, the busy rule or both")
        self.length_rule, self.busy_rule = length_rule, busy_rule
        self.max_local_prefill_tokens, self.max_uncached_ratio = max_local_prefill_tokens, max_uncached_ratio
        self.busy_queue_tasks = busy_queue_tasks

    def route(self, task: PrefillTask, view: ClusterView, now_s: float) -> RouteDecision:
        best = least_loaded_prefill(view)
        uncached_ratio = task.new_tokens / (task.hist_tokens + task.new_tokens)
        if (self.length_rule and task.new_tokens < self.max_local_prefill_tokens
                and uncached_ratio < self.max_uncached_ratio):
            return RouteDecision(task.session_id, task.round_index, task.decode_worker, True, "threshold-length",
                                 float(task.new_tokens))
        if self.busy_rule and len(best.queue) >= self.busy_queue_tasks:
            return RouteDecision(task.session_id, task.round_index, task.decode_worker, True, "threshold-busy",
                                 best.queue_drain_s)
        return RouteDecision(task.session_id, task.round_index, best.worker_id, False, "threshold-remote",
                             best.queue_drain_s)
