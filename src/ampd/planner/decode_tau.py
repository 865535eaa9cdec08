"""tau_dec(n, k): P95 ITL of one decode replica of degree n serving 1/k of the
sessions, local prefills included, and the KV it must hold (AMPD.md section 2,
[our choice]; docs/PLANNER.md, "Decode side").

The model, per replica (the binder spreads sessions evenly, so each of the k replicas
gets 1/k of everything):

- local prefills (``LocalLoad``: a fixed share spread over the stream, or the ones the
  router model sends locally beside a given prefill side) arrive at their rate / k and take from the
  decode steps a share ``u`` of the time (their mean delay); how much, and how many
  token gaps each touches, is what the decode engine's batching makes of them
  (``ampd.policy.batching.local_prefill``, the estimate the router uses): a pause
  (``alternate``) delays one gap by ``T_pre(n)``, the simulator running at most one
  between two decode steps; chunks (``chunked``) lengthen each of their mixed steps
  by the chunk's prefill beyond a one-token step, on the batch the replica holds. A
  token gap holds one decode step and, with probability ``p = local rate x mean gap
  x gaps per prefill``, a local prefill's addition;
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

Mixed degrees ([our choice], decode side; the prefill side: ``prefill_tau``; docs/PLANNER.md): k
replicas of degree b beside j < b / a replicas of a smaller degree a, the remainder of
GPUs that make no further replica of degree b. The binder (``MostFreeKvBinder``) ranks
replicas by free share of their KV capacity, so sessions split in proportion to
capacity (AMPD.md section 2: "in proportion to capacity"): a replica of degree n
carries cap(n) / C of everything, C = k cap(b) + j cap(a), and is modelled as the
replica above with k = C / cap(n), a real number. The cell's tau is the worse
group's; its memory fits when every group's does (then each holds the same share
of its capacity).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import numpy as np

from ampd.core.deployment import ReplicaGroup, Role
from ampd.perf.interface import PerfModel
from ampd.policy.batching import Batching, LocalPrefill, local_prefill
from ampd.planner.cells import TauCell, mixtures
from ampd.planner.stream import NominalStream
from ampd.planner.timeline import weighted_quantile

# Quantile levels that stand for the thinning and local-prefill-time distributions:
# enough for a P95 to within a few percent, few enough for hundreds of cells.
_THINNING_LEVELS = (np.arange(10) + 0.5) / 10
_PREFILL_LEVELS = 50
_BISECTIONS = 40


@dataclasses.dataclass(frozen=True)
class LocalLoad:
    """The local prefills the decode replicas carry together.

    Attributes:
        hist_tokens, new_tokens: shape (m,), sizes of prefills that stand for them
            (their distribution is what matters).
        per_s: local prefills per second over the whole decode side.
    """

    hist_tokens: np.ndarray
    new_tokens: np.ndarray
    per_s: float


def spread_locals(stream: NominalStream) -> LocalLoad:
    """A fixed share ``stream.local_share`` of the prefills, spread evenly over the
    stream, so their sizes follow every task's."""
    return LocalLoad(stream.hist_tokens, stream.new_tokens, stream.prefills_per_s * stream.local_share)


def routed_locals(stream: NominalStream, tasks: tuple[int, ...]) -> LocalLoad:
    """The prefills at ``tasks`` (indices in ``stream``, inside its window), the ones
    the router model runs locally (``TauCell.local_tasks``); none: no local load."""
    index = np.array(tasks, dtype=int)
    return LocalLoad(stream.hist_tokens[index], stream.new_tokens[index], index.size / stream.span_s)


@dataclasses.dataclass(frozen=True)
class _LocalStats:
    """The local prefills of the stream on a replica's batch (``local_prefill``).

    Attributes:
        delay_s: seconds one adds to the decode steps, mean over prefills (math.inf
            when the batch leaves chunks no room).
        added_s: quantiles (``_PREFILL_LEVELS``) of what one adds to a token gap it
            touches, over the gaps touched, seconds.
        gaps: token gaps of a running sequence one touches, mean over prefills.
    """

    delay_s: float
    added_s: np.ndarray
    gaps: float


@dataclasses.dataclass(frozen=True)
class DecodeReplica:
    """A decode replica of degree ``tp`` (``decode_replica``): what every cell of that
    degree shares. ``local`` gives the local prefills' stats on a batch of that many
    sequences; ``local_per_s``, local prefills per second over the whole decode side;
    ``capacity_tokens``, the KV one replica holds; ``step_s``, T_dec of that many
    sequences at the stream's mean context, seconds (cached)."""

    perf: PerfModel
    tp: int
    stream: NominalStream
    local: Callable[[int], _LocalStats]
    local_per_s: float
    capacity_tokens: int
    step_s: Callable[[int], float]


def decode_cells(replica: DecodeReplica, max_dp: int, itl_slo_s: float, scope: str) -> list[TauCell]:
    """tau_dec(n, k) for k = 1..``max_dp`` replicas like ``replica`` (``decode_replica``,
    degree n) carrying the decode side (module docstring)."""
    dps = np.arange(1, max_dp + 1, dtype=float)
    return [_cell(replica, int(dp), itl_slo_s, scope, others) for dp, others in zip(dps, _fixed_points(replica, dps))]


def decode_replica(stream: NominalStream, perf: PerfModel, tp: int, batching: Batching = Batching(),
                   local: LocalLoad | None = None) -> DecodeReplica:
    """What every decode cell of degree ``tp`` shares, one-degree and mixed.

    ``local``: the local prefills (default ``spread_locals(stream)``, the stream's
    fixed share). Their times are taken at ``tp``, the decode replica's degree, as
    ``batching`` runs them. A pause does not depend on the batch: every task of
    the stream counts. Chunks do: [our choice] the tasks at the ``_PREFILL_LEVELS``
    quantiles of ``T_pre`` stand for the stream, so each batch a cell's fixed point
    visits costs 50 estimates, not one per task.
    """
    local = spread_locals(stream) if local is None else local
    hist_tokens, new_tokens = local.hist_tokens, local.new_tokens
    levels = (np.arange(_PREFILL_LEVELS) + 0.5) / _PREFILL_LEVELS
    if batching.chunked and hist_tokens.size:
        by_time = np.argsort(perf.prefill_array_s(hist_tokens, new_tokens, tp), kind="stable")
        picked = by_time[(levels * hist_tokens.size).astype(int)]
        hist_tokens, new_tokens = hist_tokens[picked], new_tokens[picked]
    context_tokens = stream.decode.mean_context_tokens

    @functools.lru_cache(maxsize=None)
    def local_at(batch: int) -> _LocalStats:
        if batching.chunked:
            runs = _chunked_local_prefills(perf, tp, batching, hist_tokens, new_tokens, batch,
                                           round(batch * context_tokens))
        else:
            runs = [local_prefill(perf, tp, batching, h, x, batch, round(batch * context_tokens))
                    for h, x in zip(hist_tokens.tolist(), new_tokens.tolist())]
        added = [a for run in runs for a in run.added_s]
        if not added:
            return _LocalStats(math.inf, np.zeros(levels.size), 0.0)
        return _LocalStats(float(np.mean([run.delay_s for run in runs])), np.quantile(added, levels),
                           float(np.mean([len(run.added_s) for run in runs])))

    if local.per_s == 0.0:  # no local prefill ever arrives: nothing of theirs to estimate
        fixed = _LocalStats(0.0, np.zeros(levels.size), 0.0)
    else:  # a pause does not depend on the batch, chunks do
        fixed = None if batching.chunked else local_at(1)
    stats = local_at if fixed is None else (lambda batch: fixed)

    @functools.lru_cache(maxsize=None)  # every cell's fixed point asks for the same batches again
    def step_s(batch: int) -> float:
        return perf.decode_step_s(batch, round(batch * context_tokens), tp)

    return DecodeReplica(perf, tp, stream, stats, local.per_s, perf.kv_capacity_tokens(tp), step_s)


def _chunked_local_prefills(perf: PerfModel, tp: int, batching: Batching, hist_tokens: np.ndarray,
                            new_tokens: np.ndarray, batch_size: int, context_tokens: int) -> list[LocalPrefill]:
    """``policy.batching.local_prefill`` of each of the prefills ``(hist_tokens[i],
    new_tokens[i])`` under chunks, all stepped together so that each step's prefill
    costs are one array call (``PerfModel.prefill_array_s``): every chunk, step time,
    addition and sum is the scalar function's, in its order, so each result equals it
    bit for bit (tests/test_planner_tau.py)."""
    if batch_size >= batching.chunk_tokens:
        return [LocalPrefill(math.inf, ())] * hist_tokens.size  # the batch takes the whole budget
    done = np.zeros(hist_tokens.size, dtype=np.int64)
    total_s = np.zeros(hist_tokens.size)
    added_s: list[list[float]] = [[] for _ in range(hist_tokens.size)]
    while (running := np.flatnonzero(done < new_tokens)).size:
        chunk = np.minimum(new_tokens[running] - done[running], batching.chunk_tokens - batch_size)
        step_s = perf.prefill_array_s(hist_tokens[running] + done[running], chunk, tp)
        if batch_size:
            decode_s = perf.decode_step_s(batch_size, context_tokens, tp)
            step_s = step_s + (decode_s - perf.decode_step_s(1, 0, tp))
            for i, a in zip(running.tolist(), (step_s - decode_s).tolist()):
                added_s[i].append(a)
        total_s[running] += step_s
        done[running] += chunk
        context_tokens += batch_size
    return [LocalPrefill(t, tuple(a)) for t, a in zip(total_s.tolist(), added_s)]


def mixed_decode_cells(replicas: Sequence[DecodeReplica], max_gpus: int, itl_slo_s: float,
                       scope: str) -> list[TauCell]:
    """Every decode cell of two degrees (module docstring, "Mixed degrees") within
    ``max_gpus`` GPUs: for each pair of ``replicas`` (``decode_replica``, one per
    degree) of degrees a < b, k >= 1 replicas of degree b beside j replicas of degree
    a, 1 <= j and j a < b (``cells.mixtures``)."""
    by_tp = {r.tp: r for r in replicas}
    return [_mixed_cell(by_tp[b], k, by_tp[a], j, itl_slo_s, scope)
            for b, a, j, ks in mixtures([r.tp for r in replicas], max_gpus) for k in ks]


def _mixed_cell(main: DecodeReplica, k: int, rest: DecodeReplica, j: int, itl_slo_s: float, scope: str) -> TauCell:
    total_tokens = k * main.capacity_tokens + j * rest.capacity_tokens
    cell = TauCell(Role.DECODE, main.tp, k, None, itl_slo_s, 0, main.capacity_tokens,
                   extra=(ReplicaGroup(Role.DECODE, rest.tp, j),))
    served = [(r, _serve(r, total_tokens / r.capacity_tokens, scope)) for r in (main, rest)]
    for r, (p95_s, _, reason) in served:
        if p95_s is None:
            return dataclasses.replace(cell, reason=f"its TP={r.tp} replicas: {reason}")
    fullest = max(kv_tokens / r.capacity_tokens for r, (_, kv_tokens, _) in served)
    return dataclasses.replace(cell, p95_s=max(p95_s for _, (p95_s, _, _) in served),
                               kv_tokens=math.ceil(fullest * main.capacity_tokens))


def _cell(r: DecodeReplica, dp: int, itl_slo_s: float, scope: str, others: float) -> TauCell:
    p95_s, kv_tokens, reason = _serve(r, float(dp), scope, others)
    return TauCell(Role.DECODE, r.tp, dp, p95_s, itl_slo_s, math.ceil(kv_tokens), r.capacity_tokens, reason)


def _serve(r: DecodeReplica, dp: float, scope: str, others: float | None = None) -> tuple[float | None, float, str]:
    """One replica of ``r`` carrying 1 / ``dp`` of the sessions (``dp`` > 0, real):
    its P95 ITL (None when overloaded), the P95 KV tokens it holds, and why it is
    overloaded ('' when not). ``others``: its ``_fixed_points`` when the caller has it
    (NaN: none), else found here."""
    local_per_s = r.local_per_s / dp

    def local_busy(others: float) -> float:
        """Share of the time local prefills take from the decode steps of a batch of
        ``1 + others`` sequences."""
        return local_per_s * r.local(max(1, round(1.0 + others))).delay_s

    if math.isinf(local_busy(0.0)):
        return None, 0.0, "the chunk budget leaves local prefills no room beside the batch"
    if local_busy(0.0) >= 1.0:
        return None, 0.0, f"local prefills alone need {local_busy(0.0):.2f} x the replica"
    others = float(_fixed_points(r, np.array([dp]))[0]) if others is None else others
    if math.isnan(others):
        return None, 0.0, "decode work outgrows any batch the KV capacity allows"
    busy = local_busy(others)
    local = r.local(max(1, round(1.0 + others)))
    gap_s = _step_s(r, 1.0 + others) / (1.0 - busy)
    interrupted = local_per_s * gap_s * local.gaps
    if interrupted >= 1.0:
        return None, 0.0, "local prefills arrive faster than decode steps"
    if scope == "strict":
        p95_s = _itl_p95_s(r, dp, gap_s, interrupted, local.added_s)
    else:
        p95_s = _step_s(r, 1.0 + r.stream.decode.session_others_p95_at(gap_s) / dp) / (1.0 - busy)
    return p95_s, r.stream.decode.kv_p95_tokens_at(gap_s) / dp, ""


def _step_s(r: DecodeReplica, batch: float) -> float:
    """T_dec at a real batch size (>= 1), linear between the integer sizes around it."""
    low = math.floor(batch)
    frac = batch - low
    at_low = r.step_s(low)
    if frac == 0.0:
        return at_low
    return at_low + frac * (r.step_s(low + 1) - at_low)


def _fixed_points(r: DecodeReplica, dps: np.ndarray) -> np.ndarray:
    """For each k of ``dps`` (shape (c,), real, > 0): the smallest o >= 0 with
    ``others(T_dec(1 + o) / (1 - u(o))) / k <= o``, u(o) being the share of the time
    local prefills take from a batch of ``1 + o`` (``_serve``'s ``local_busy``); NaN
    when there is none below the batch the KV capacity holds (a batch whose local
    prefills take all the time has none). Found by doubling, then ``_BISECTIONS``
    bisections, every cell's steps taken together on arrays: the same floats as one
    cell at a time (numpy's interp and rounding are Python's, elementwise)."""
    load = r.stream.decode
    limit = r.capacity_tokens / max(load.mean_context_tokens, 1.0) - 1.0
    local_per_s = r.local_per_s / dps

    def excess(o: np.ndarray, cells: np.ndarray) -> np.ndarray:
        batches = np.maximum(1, np.round(1.0 + o)).astype(np.int64).tolist()
        busy = local_per_s[cells] * np.array([r.local(b).delay_s for b in batches])
        with np.errstate(divide="ignore", invalid="ignore"):
            value = np.interp(np.array([_step_s(r, b) for b in (1.0 + o).tolist()]) / (1.0 - busy), load.pace_s, load.others) / dps[cells] - o
        return np.where(busy >= 1.0, np.inf, value)

    found = np.where(excess(np.zeros(dps.size), np.arange(dps.size)) <= 0.0, 0.0, np.nan)
    low, high = np.zeros(dps.size), np.ones(dps.size)
    growing = np.flatnonzero(np.isnan(found))
    bracketed = []
    while growing.size:
        above = excess(high[growing], growing) > 0.0
        bracketed.append(growing[~above])
        growing = growing[above & (high[growing] < limit)]  # the rest reached the limit: none
        low[growing], high[growing] = high[growing], np.minimum(2.0 * high[growing], limit)
    cells = np.concatenate(bracketed) if bracketed else np.zeros(0, dtype=np.int64)
    for _ in range(_BISECTIONS):
        mid = 0.5 * (low[cells] + high[cells])
        above = excess(mid, cells) > 0.0
        low[cells] = np.where(above, mid, low[cells])
        high[cells] = np.where(above, high[cells], mid)
    found[cells] = high[cells]
    return found


def _itl_p95_s(r: DecodeReplica, dp: float, gap_s: float, interrupted: float, added_s: np.ndarray) -> float:
    """P95 of a token gap: one decode step at the batch the token sees (module
    docstring), plus, with probability ``interrupted``, what a local prefill adds
    to a gap (``added_s``, its quantiles)."""
    from scipy.stats import binom  # here, not at the top: scipy.stats takes most of a second to import

    cluster = np.rint(r.stream.decode.others_quantiles_at(gap_s))
    mine = binom.ppf(_THINNING_LEVELS[:, None], cluster[None, :], 1.0 / dp).ravel()
    batches, counts = np.unique(mine, return_counts=True)
    steps_s = np.array([_step_s(r, 1.0 + b) for b in batches])
    with_prefill_s = (steps_s[:, None] + added_s[None, :]).ravel()
    weights = np.concatenate([(1.0 - interrupted) * counts / counts.sum(),
                              interrupted * np.repeat(counts / counts.sum(), added_s.size) / added_s.size])
    return weighted_quantile(np.concatenate([steps_s, with_prefill_s]), weights, 0.95)
