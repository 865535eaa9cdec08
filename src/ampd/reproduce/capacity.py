"""Where a cell's knee is, to place its rates around it (AMPD.md section 4 gives
no arrival rates: [our choice]).

The knee is found by simulation: the rate at which a reference system (plain PD
disaggregation on an even split of the GPUs) attains its SLO for half of the
sessions, by geometric bisection between a tenth and four times the
prefill-bound rate. A finite run of long sessions (GAIA's live minutes) carries
less load than its arrival rate suggests in steady state, which is why the knee
is measured and not computed."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ampd.config import RunConfig, override
from ampd.core.session import Session
from ampd.perf.interface import PerfModel
from ampd.slo_rule import reference_tp


def prefill_bound_rate_per_s(perf: PerfModel, sessions: list[Session], num_gpus: int) -> float:
    """Sessions per second that would keep every GPU busy prefilling, on replicas of
    the reference TP (``slo_rule.reference_tp``): ``num_gpus`` divided by the
    GPU-seconds of prefill a mean session needs. An upper bound on any system's
    capacity (decoding needs GPUs too); the grid's rates are fractions of it."""
    tp = reference_tp(perf)
    gpu_s = sum(tp * perf.prefill_s(s.history_tokens(i), r.input_tokens, tp)
                for s in sessions for i, r in enumerate(s.rounds))
    return num_gpus * len(sessions) / gpu_s


KNEE_ATTAINMENT = 0.5
BISECTION_STEPS = 6


def find_knees(configs: Sequence[RunConfig], bounds_per_s: Sequence[float],
               evaluate: Callable[[Sequence[RunConfig]], list[dict]]) -> list[float]:
    """The knee rate (sessions/s) of each configuration: geometric bisection on
    ``workload.rate_per_s`` in ``[bound / 10, 4 x bound]`` for the rate where SLO
    attainment crosses ``KNEE_ATTAINMENT``; all configurations step together, so
    each step's simulations run in parallel."""
    low = [b / 10 for b in bounds_per_s]
    high = [4 * b for b in bounds_per_s]
    for _ in range(BISECTION_STEPS):
        mid = [math.sqrt(lo * hi) for lo, hi in zip(low, high)]
        rows = evaluate([override(c, workload={"rate_per_s": m}) for c, m in zip(configs, mid)])
        for i, row in enumerate(rows):
            if row["slo_attainment"] >= KNEE_ATTAINMENT:
                low[i] = mid[i]
            else:
                high[i] = mid[i]
    return [math.sqrt(lo * hi) for lo, hi in zip(low, high)]
