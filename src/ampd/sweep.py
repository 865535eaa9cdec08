"""Sweeps: systems x workloads x rates, each point one simulation, run on every
core. Thresholds are resolved once per workload (from its sample sessions) so
every system and rate of that workload is judged alike; an ``auto`` deployment
once per workload and system (``_planned``); each point's warm-up, window and
drain at its own rate (``resolve_measure``)."""

from __future__ import annotations

from collections.abc import Sequence

from ampd.config import RunConfig, SweepConfig, override
from ampd.core.errors import InputError
from ampd.experiment import measure_for, perf_model_for, slo_for
from ampd.measure import CapacitySearch, find_capacities
from ampd.planning import resolve_deployment
from ampd.runner import PointRunner
from ampd.workload import WORKLOADS


def workload_source(text: str) -> dict:
    """The ``workload`` fields for a command-line workload: a synthetic name
    (``toolbench``), a shipped trace (``builtin:mooncake-conversation``) or a file."""
    if not text.strip():
        raise InputError("workload: empty name; give a synthetic workload, builtin:<trace> or a file")
    if text.lower() in WORKLOADS:
        return {"name": text.lower(), "trace": None, "trace_format": None}
    return {"name": None, "trace": text}


def resolve_slo(config: RunConfig) -> RunConfig:
    """``config`` with both thresholds set (derived where missing)."""
    slo = slo_for(config, perf_model_for(config))
    return override(config, slo={"ttft_s": slo.ttft_s, "itl_s": slo.itl_s})


def resolve_measure(config: RunConfig) -> RunConfig:
    """``config`` with its warm-up, window and drain set (derived where missing;
    unchanged for a run of ``workload.num_sessions`` sessions)."""
    plan = measure_for(config)
    if plan is None:
        return config
    return override(config, measure={"warmup_s": plan.warmup_s, "window_s": plan.window_s, "drain_s": plan.drain_s})


def resolve(config: RunConfig) -> RunConfig:
    """``config`` ready to run and to save: thresholds, measurement and deployment
    explicit."""
    return resolve_deployment(resolve_measure(resolve_slo(config)))


def _planned(config: RunConfig, rates_per_s: Sequence[float]) -> RunConfig:
    """``config`` with an ``auto`` deployment planned once for the sweep's load:
    [our choice] at the median rate, or at the next lower rate where the planner
    finds a feasible plan (an overloaded rate has none)."""
    ordered = sorted(rates_per_s)
    candidates = ordered[: len(ordered) // 2 + 1][::-1]
    for rate in candidates[:-1]:
        try:
            return resolve_deployment(override(config, workload={"rate_per_s": rate}))
        except InputError:
            continue
    return resolve_deployment(override(config, workload={"rate_per_s": candidates[-1]}))


def plan_sweep(base: RunConfig, sweep: SweepConfig) -> list[RunConfig]:
    """Every point's full configuration, thresholds resolved per workload.

    Raises:
        InputError: an invalid system, workload or rate.
    """
    configs = []
    for w in sweep.workloads:
        extra = {k: v for k, v in (("arrivals", w.arrivals), ("num_sessions", w.num_sessions)) if v is not None}
        first = override(base, workload={**workload_source(w.workload), **extra, "rate_per_s": min(w.rates_per_s)})
        resolved = resolve_slo(first)
        for system in sweep.systems:
            cluster = {"deployment": sweep.deployments[system]} if system in sweep.deployments else {}
            planned = _planned(override(resolved, system=system, cluster=cluster), w.rates_per_s)
            for rate in w.rates_per_s:
                configs.append(resolve_measure(override(planned, workload={"rate_per_s": rate})))
    return configs


def sweep_capacities(configs: Sequence[RunConfig], rows: Sequence[dict], run: PointRunner) -> list[dict]:
    """The capacity (``ampd.measure.capacity``) of every (workload, system) of a
    swept ``configs``, each search seeded with the sweep's own points at that
    workload and system, so it starts from their bracket. One row per pair: its
    deployment, ``capacity_per_s``, ``capacity_per_gpu``, the bracket's upper end
    ``above_per_s`` (the lowest rate measured not to meet the SLO; None when the
    search found none) and ``num_runs``."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, c in enumerate(configs):
        groups.setdefault((c.workload.label, c.system), []).append(i)
    bases, searches = [], []
    for indices in groups.values():
        base = configs[indices[0]]
        search = CapacitySearch(max(configs[i].workload.rate_per_s for i in indices))
        for i in indices:
            search.record(configs[i].workload.rate_per_s, rows[i])
        bases.append(base)
        searches.append(search)
    find_capacities(searches, lambda batch: run([resolve_measure(override(bases[i], workload={"rate_per_s": r}))
                                                  for i, r in batch]))
    return [{"workload": b.workload.label, "system": b.system, "deployment": b.cluster.deployment,
             "num_gpus": b.cluster.num_gpus, "capacity_per_s": s.capacity_per_s,
             "capacity_per_gpu": s.capacity_per_s / b.cluster.num_gpus, "above_per_s": s.high_per_s,
             "bounded": s.bounded, "num_runs": len(s.rows)}
            for b, s in zip(bases, searches)]
