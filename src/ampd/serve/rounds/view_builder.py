"""The coordinator's ``ClusterView``, built from the shared store's worker
states: the same snapshot the simulator gives the policies (DESIGN.md section 4)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ampd.core.deployment import Role
from ampd.core.engine_kinds import READS_HISTORY
from ampd.core.view import ClusterView, WorkerView
from ampd.perf.interface import PerfModel
from ampd.serve.rounds.decode_batch import merged
from ampd.serve.state.store import QueueEntry, WorkerInfo, WorkerState


def busy_s(inflight: Iterable[QueueEntry], now_s: float) -> float:
    """Predicted time until a prefill worker finishes its dispatched tasks: they
    run one after the other from the first dispatch on, seconds (0 when idle)."""
    entries = list(inflight)
    if not entries:
        return 0.0
    start_s = min(e.dispatch_s if e.dispatch_s is not None else now_s for e in entries)
    return max(0.0, start_s + sum(e.queued.cost_s for e in entries) - now_s)


def worker_view(info: WorkerInfo, state: WorkerState, perf: PerfModel, now_s: float,
                batch_max_age_s: float) -> WorkerView:
    """One worker as a policy sees it. A prefill worker's queue is the
    coordinator's queue for it and its busy time the dispatched work; a decode
    worker's queue is its local prefills still before their first token, its
    batch what the replicas' reports no older than ``batch_max_age_s`` (model
    seconds) add up to (``decode_batch``)."""
    spec = info.spec
    if spec.role is Role.PREFILL:
        return WorkerView(spec, tuple(e.queued for e in state.queue), busy_s(state.inflight, now_s),
                          state.ttft_mean_s, None, reads_history=READS_HISTORY[info.kind])
    batch = merged(state.batches, now_s, batch_max_age_s)
    return WorkerView(spec, tuple(e.queued for e in state.inflight), 0.0, None, state.itl_mean_s,
                      perf.kv_capacity_tokens(spec.tp), state.kv_used_tokens, batch_size=batch.batch_size,
                      context_tokens=batch.context_tokens, min_itl_slack_s=batch.min_itl_slack_s)


def cluster_view(infos: Mapping[int, WorkerInfo], states: Iterable[WorkerState], perf: PerfModel,
                 now_s: float, batch_max_age_s: float) -> ClusterView:
    """The live workers (dead ones are left out, so no policy picks them)."""
    return ClusterView(tuple(worker_view(infos[s.worker_id], s, perf, now_s, batch_max_age_s)
                             for s in states if s.alive))
