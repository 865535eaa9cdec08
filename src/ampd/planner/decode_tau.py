"""tau_dec(n, k): P95 ITL of one decode replica of degree n serving 1/k of the
sessions, local prefills included, and the KV it must hold (AMPD.md section 2,
[our choice]; docs/PLANNER.md, "Decode side").

The model, per replica (the binder spreads sessions evenly, so each of the k replicas
gets 1/k of everything):

- local prefills arrive at ``local_share x prefills per second / k`` and occupy the
  replica a share ``u`` of the time (their mean ``T_pre(n)``); the simulator runs at
  most one between two decode steps, so a token gap holds one decode step and, with
  probability ``p = local rate x mean gap``, one local prefill;
- the mean gap solves ``gap = T_dec(1 + o) / (1 - u)`` with ``o = others(gap) / k``, the
  other sequences a token shares its step with when every token takes ``gap``
  (``decode_load``); the smallest fixed point is the steady state, and none below the
  batch the KV capacity allows means overloaded;
- the batch a token sees is itself plus its share of the others the whole cluster's
  tokens see at that pace (their distribution over tokens, from the timeline: a
  Poisson law in a steady state, the hump of a burst otherwise), each other sequence
  on the same replica with probability 1/k (Binomial thinning: exact for a random
  split, an upper bound on the spread of the binder's balanced one);
- ``scope="strict"`` (the paper's P95 latency): tau from the P95 of a token's gap;
  ``scope="mean"`` (what mean-scope attainment judges): from the P95 over sessions of
  their mean gap, ``T_dec(1 + o_s / k) / (1 - u)`` with ``o_s`` a session's mean others
  (the prefill pauses spread over its tokens);
- KV: P95 of the KV all sessions hold at that pace, over k.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy.stats import binom

from ampd.core.deployment import Role
from ampd.perf.interface import PerfModel
from ampd.planner.cells import TauCell
from ampd.planner.stream import NominalStream
from ampd.planner.timeline import weighted_quantile

# Quantile levels that stand for the thinning and local-prefill-time distributions:
# enough for a P95 to within a few percent, few enough for hundreds of cells.
_THINNING_LEVELS = (np.arange(10) + 0.5) / 10
_PREFILL_LEVELS = 50
_BISECTIONS = 40


@dataclasses.dataclass(frozen=True)
class _Replica:
    """What every cell of one degree shares."""

    perf: PerfModel
    tp: int
    stream: NominalStream
    prefill_s: np.ndarray  # quantiles of T_pre(tp) over the stream's tasks, shape (_PREFILL_LEVELS,)
    mean_prefill_s: float
    capacity_tokens: int


def decode_cells(stream: NominalStream, perf: PerfModel, tp: int, max_dp: int, itl_slo_s: float,
                 scope: str) -> list[TauCell]:
    """tau_dec(tp, k) for k = 1..``max_dp`` (module docstring).

    Local prefills are spread evenly over the stream, so their sizes follow the
    stream's; their times are taken at ``tp``, the decode replica's degree.
    """
    times_s = [perf.prefill_s(h, x, tp) for h, x in zip(stream.hist_tokens.tolist(), stream.new_tokens.tolist())]
    levels = (np.arange(_PREFILL_LEVELS) + 0.5) / _PREFILL_LEVELS
    replica = _Replica(perf, tp, stream, np.quantile(times_s, levels), float(np.mean(times_s)),
                       perf.kv_capacity_tokens(tp))
    return [_cell(replica, dp, itl_slo_s, scope) for dp in range(1, max_dp + 1)]


def _cell(r: _Replica, dp: int, itl_slo_s: float, scope: str) -> TauCell:
    overloaded = TauCell(Role.DECODE, r.tp, dp, None, itl_slo_s, 0, r.capacity_tokens)
    local_per_s = r.stream.prefills_per_s * r.stream.local_share / dp
    local_busy = local_per_s * r.mean_prefill_s
    if local_busy >= 1.0:
        return dataclasses.replace(overloaded, reason=f"local prefills alone need {local_busy:.2f} x the replica")
    others = _others(r, dp, local_busy)
    if others is None:
        return dataclasses.replace(overloaded, reason="decode work outgrows any batch the KV capacity allows")
    gap_s = _step_s(r, 1.0 + others) / (1.0 - local_busy)
    interrupted = local_per_s * gap_s
    if interrupted >= 1.0:
        return dataclasses.replace(overloaded, reason="local prefills arrive faster than decode steps")
    if scope == "strict":
        p95_s = _itl_p95_s(r, dp, gap_s, interrupted)
    else:
        p95_s = _step_s(r, 1.0 + r.stream.decode.session_others_p95_at(gap_s) / dp) / (1.0 - local_busy)
    return dataclasses.replace(overloaded, p95_s=p95_s,
                               kv_tokens=math.ceil(r.stream.decode.kv_p95_tokens_at(gap_s) / dp))


def _step_s(r: _Replica, batch: float) -> float:
    """T_dec at a real batch size (>= 1), linear between the integer sizes around it."""
    low = math.floor(batch)
    frac = batch - low
    context = r.stream.decode.mean_context_tokens
    at_low = r.perf.decode_step_s(low, round(low * context), r.tp)
    if frac == 0.0:
        return at_low
    return at_low + frac * (r.perf.decode_step_s(low + 1, round((low + 1) * context), r.tp) - at_low)


def _others(r: _Replica, dp: int, local_busy: float) -> float | None:
    """Smallest o >= 0 with ``others(T_dec(1 + o) / (1 - u)) / k <= o``; None when there
    is none below the batch the KV capacity holds."""
    load = r.stream.decode

    def excess(o: float) -> float:
        return load.others_at(_step_s(r, 1.0 + o) / (1.0 - local_busy)) / dp - o

    limit = r.capacity_tokens / max(load.mean_context_tokens, 1.0) - 1.0
    if excess(0.0) <= 0.0:
        return 0.0
    low, high = 0.0, 1.0
    while excess(high) > 0.0:
        if high >= limit:
            return None
        low, high = high, min(2.0 * high, limit)
    for _ in range(_BISECTIONS):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if excess(mid) > 0.0 else (low, mid)
    return high


def _itl_p95_s(r: _Replica, dp: int, gap_s: float, interrupted: float) -> float:
    """P95 of a token gap: one decode step at the batch the token sees (module
    docstring), plus one local prefill with probability ``interrupted``."""
    cluster = np.rint(r.stream.decode.others_quantiles_at(gap_s))
    mine = binom.ppf(_THINNING_LEVELS[:, None], cluster[None, :], 1.0 / dp).ravel()
    batches, counts = np.unique(mine, return_counts=True)
    steps_s = np.array([_step_s(r, 1.0 + b) for b in batches])
    with_prefill_s = (steps_s[:, None] + r.prefill_s[None, :]).ravel()
    weights = np.concatenate([(1.0 - interrupted) * counts / counts.sum(),
                              interrupted * np.repeat(counts / counts.sum(), r.prefill_s.size) / r.prefill_s.size])
    return weighted_quantile(np.concatenate([steps_s, with_prefill_s]), weights, 0.95)
