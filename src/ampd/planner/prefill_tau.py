"""tau_pre(n, k): P95 TTFT of the remote prefills when k prefill replicas of degree
n (with mixed degrees, and a group of a smaller degree beside them) share the
nominal stream (AMPD.md section 2, [our choice]; docs/PLANNER.md)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from ampd.core.deployment import ReplicaGroup, Role, WorkerSpec
from ampd.perf.interface import PerfModel
from ampd.planner.cells import TauCell, mixtures
from ampd.planner.queueing import PrefillChains, ServerGroup, fcfs_ttft_s
from ampd.planner.stream import NominalStream

_ROUTED_MAX_UTILISATION = 2.0
"""[our choice] Under the router model, a prefill side whose replicas could carry less than
half the prefill work is overloaded: the decode replicas would run most prefills for good,
colocated serving in all but name, which the planner leaves out as it leaves out
decode-only plans (docs/PLANNER.md); it also saves the Lindley passes and the co-design's
visits to prefill sides that cannot win (the 5 s bound at 256 GPUs, issue 12)."""


def prefill_cells(stream: NominalStream, perf: PerfModel, tp: int, max_dp: int, ttft_slo_s: float,
                  cross_server: bool, scope: str, local_above_s: float = math.inf,
                  chains: PrefillChains | None = None) -> list[TauCell]:
    """tau_pre(tp, k) for k = 1..``max_dp``.

    Each remote task's TTFT comes from the closed FCFS multi-server queue of
    ``queueing.fcfs_ttft_s``: read = ``T_kv(history)`` from the decode replica, compute =
    ``T_pre(history, new; tp)``, send = ``T_kv(new)`` back (``perf.remote_stages_s``: where a
    profile measured the engines' requests, no read ahead, the export and the prefill
    request, the join). A local task takes its
    ``T_pre`` at ``tp`` unqueued (a prefill cell does not know the decode degree). The P95
    is over the remote tasks (``scope="strict"``, the paper's P95 latency), or over
    sessions of the mean TTFT of their remote rounds (``scope="mean"``, what mean-scope
    attainment judges). A cell whose prefill work reaches k x the nominal stream's span
    (utilisation >= 1, work and span read in the stream's window) is overloaded: a
    finite stream would give it a finite but meaningless P95. The P95s are over the
    tasks of the sessions the window measures. Once no task waits at some k, more replicas change nothing, so
    larger k copy that cell.

    Under the router model (``local_above_s`` finite, docs/PLANNER.md "Co-design"),
    the router sends a task locally when its predicted remote TTFT exceeds
    ``local_above_s`` (``queueing.fcfs_ttft_s``): the replicas never fall behind for
    good, the overflow going to the decode replicas, so a cell whose replicas could not
    carry the whole prefill work alone is a plan (the router keeps the longest
    prefills local). Up to ``_ROUTED_MAX_UTILISATION``: beyond, it is overloaded. Each cell records the share and the indices of the window's tasks that ran locally, and
    its P95 is over every measured task, local ones at their ``T_pre`` (plus a local
    round's serving path, ``perf.round_paths_s``): the router
    chose where they run, so their TTFT is part of what this side delivers.

    Args:
        cross_server: KV moves over the network (the cluster spans servers and the
            placement is not known yet, so we take the slower link), else over NVLink.
        local_above_s: alpha x the TTFT threshold under the router model, seconds;
            ``math.inf`` (default): the stream's own remote tasks, a fixed share.
        chains: ``prefill_chains(stream, perf, tp, cross_server)`` when the caller has
            it (it is the costly part of a side); None: built here.
    """
    chains = prefill_chains(stream, perf, tp, cross_server) if chains is None else chains
    base = TauCell(Role.PREFILL, tp, 0, None, ttft_slo_s, 0, perf.kv_capacity_tokens(tp))
    work_s = _work_s(stream, chains.compute_s)
    return _series(stream, chains, (), base, range(1, max_dp + 1), lambda dp: work_s / dp, scope, local_above_s)


def mixed_prefill_cells(stream: NominalStream, perf: PerfModel, degrees: Sequence[int], max_gpus: int,
                        ttft_slo_s: float, cross_server: bool, scope: str,
                        local_above_s: float = math.inf,
                        chains: Mapping[int, PrefillChains] | None = None) -> list[TauCell]:
    """Every prefill cell of two degrees within ``max_gpus`` GPUs (docs/PLANNER.md,
    "Mixed degrees"): for degrees a < b of ``degrees``, k >= 1 replicas of degree b
    beside j replicas of degree a, 1 <= j and j a < b (the GPUs that make no further
    replica of degree b): ``cells.mixtures``, as the decode side's.

    All of them share one FCFS queue (``queueing.fcfs_ttft_s`` with ``beside``): the
    system's rule picks the group per task, so the split follows the load, not a
    fixed proportion. Utilisation: the window's prefill work against what the side
    serves, a replica of degree n doing ``span / work(n)`` of it (``work(n)``: the
    window's remote compute at n). Everything else, P95, router model, saturation
    along k, is ``prefill_cells``'s; arguments as there (``chains``: by degree).
    """
    if chains is None:
        chains = {n: prefill_chains(stream, perf, n, cross_server) for n in degrees}
    work_s = {n: _work_s(stream, c.compute_s) for n, c in chains.items()}
    cells = []
    for b, a, j, ks in mixtures(degrees, max_gpus):
        rest = chains[a]
        beside = (ServerGroup(j, rest.read_s, rest.compute_s, rest.send_s, rest.remote_paths_s),)
        base = TauCell(Role.PREFILL, b, 0, None, ttft_slo_s, 0, perf.kv_capacity_tokens(b),
                       extra=(ReplicaGroup(Role.PREFILL, a, j),))
        cells += _series(stream, chains[b], beside, base, ks,
                         lambda k, b=b, a=a, j=j: 1.0 / (k / work_s[b] + j / work_s[a]), scope, local_above_s)
    return cells


def _work_s(stream: NominalStream, compute_s: np.ndarray) -> float:
    """Prefill work of the window's remote tasks, seconds."""
    counted = compute_s[stream.remote & stream.in_window]
    return float(np.cumsum(counted)[-1]) if counted.size else 0.0  # added in order, as a loop adds them


def _series(stream: NominalStream, chains: PrefillChains, beside: tuple[ServerGroup, ...], base: TauCell,
            counts: range, load_s, scope: str, local_above_s: float) -> list[TauCell]:
    """The cells of ``base`` at each count k of its main group (``beside`` fixed), in
    increasing k. ``load_s(k)``: the window's prefill work per second of capacity k
    replicas (with ``beside``) serve, seconds; over the span it is the utilisation."""
    routed = local_above_s < math.inf
    counted = stream.measured if routed else stream.remote & stream.measured
    session = stream.session[counted]
    in_window = stream.in_window
    cells, saturated = [], None
    for dp in counts:
        if saturated is not None:
            cells.append(dataclasses.replace(saturated, dp=dp))
            continue
        utilisation = load_s(dp) / stream.span_s
        if utilisation >= (_ROUTED_MAX_UTILISATION if routed else 1.0):
            side = " and ".join(f"{g.dp} replica(s) of TP={g.tp}" for g in dataclasses.replace(base, dp=dp).groups)
            reason = f"prefill work is {utilisation:.2f} x what {side} serve"
            cells.append(dataclasses.replace(base, dp=dp, reason=reason))
            continue
        run = fcfs_ttft_s(chains, dp, local_above_s, beside)
        p95_s = _p95_s(run.ttft_s[counted], session, scope)
        local = run.local & in_window if routed else np.zeros(in_window.size, dtype=bool)
        cells.append(dataclasses.replace(base, dp=dp, p95_s=p95_s, local_share=float(local.sum() / in_window.sum()),
                                         local_tasks=tuple(np.flatnonzero(local).tolist())))
        saturated = None if run.waited else cells[-1]
    return cells


def prefill_chains(stream: NominalStream, perf: PerfModel, tp: int, cross_server: bool) -> PrefillChains:
    """The stream's tasks with their stages on a prefill replica of degree ``tp`` (a decode
    replica of the same degree at the other end; ``cross_server``: over the network)."""
    prefill = WorkerSpec(0, Role.PREFILL, tp, 0)
    decode = WorkerSpec(1, Role.DECODE, tp, 1 if cross_server else 0)
    stages = perf.remote_stages_array_s(stream.hist_tokens, stream.new_tokens, prefill, decode)
    return PrefillChains(stream.ready_s, stages.read_s, stages.compute_s, stages.send_s, stream.remote,
                         stream.after_s, stream.next_task, tuple(perf.round_paths_s(tp, tp)),
                         perf.round_paths_s(None, tp).before_s,
                         perf.prefill_array_s(stream.hist_tokens, stream.new_tokens, tp))


def _p95_s(ttft_s: np.ndarray, session: np.ndarray, scope: str) -> float:
    """P95 of the tasks' TTFTs (strict), or of their sessions' mean TTFTs (mean)."""
    if scope == "strict":
        return float(np.percentile(ttft_s, 95))
    rounds = np.bincount(session)
    return float(np.percentile(np.bincount(session, ttft_s)[rounds > 0] / rounds[rounds > 0], 95))
