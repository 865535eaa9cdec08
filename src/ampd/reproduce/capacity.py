"""Where a cell's capacity search starts (AMPD.md section 4 gives no arrival
rates: [our choice])."""

from __future__ import annotations

from ampd.core.session import Session
from ampd.perf.interface import PerfModel
from ampd.run.slo_rule import reference_tp


def prefill_bound_rate_per_s(perf: PerfModel, sessions: list[Session], num_gpus: int) -> float:
    """Sessions per second that would keep every GPU busy prefilling, on replicas of
    the reference TP (``slo_rule.reference_tp``): ``num_gpus`` divided by the
    GPU-seconds of prefill a mean session needs. An upper bound on any system's
    capacity (decoding needs GPUs too), so a capacity search starting there only
    halves its way down."""
    tp = reference_tp(perf)
    gpu_s = sum(tp * perf.prefill_s(s.history_tokens(i), r.input_tokens, tp)
                for s in sessions for i, r in enumerate(s.rounds))
    return num_gpus * len(sessions) / gpu_s
