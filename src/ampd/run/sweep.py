"""Sweeps: systems x workloads x rates, each point one simulation, run on every
core. Thresholds are resolved once per workload (from its sample sessions) so
every system and rate of that workload is judged alike; an ``auto`` deployment
once per workload and system (``_planned``). A point's warm-up, window and
drain are left as the user set them, so each rate gets its own defaults when it
runs (``ampd.run.resolve.measure_for``); ``resolve_measure`` writes them out."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ampd.run.capacity_search import search_capacities
from ampd.config import BUILTIN_PREFIX, RunConfig, SweepConfig, override
from ampd.core.errors import InputError
from ampd.core.names import unknown_name
from ampd.run.resolve import check_runnable, measure_for, perf_model_for, rate_for, slo_for
from ampd.measure import CapacitySearch
from ampd.run.planning import resolve_deployment
from ampd.run.runner import PointRunner
from ampd.workload import BUILTIN_TRACES, WORKLOADS


def workload_source(text: str) -> dict:
    """The ``workload`` fields for a command-line workload: a synthetic name
    (``toolbench``), a shipped trace (``builtin:mooncake-conversation``) or a file.

    Raises:
        InputError: empty, or neither a known name nor an existing file (the
            message lists the known workloads and shipped traces, closest first).
    """
    if not text.strip():
        raise InputError("workload: empty name; give a synthetic workload, builtin:<trace> or a file")
    if text.lower() in WORKLOADS:
        return {"name": text.lower(), "trace": None, "trace_format": None}
    if not text.startswith(BUILTIN_PREFIX) and not Path(text).exists():
        known = [*WORKLOADS, *(BUILTIN_PREFIX + name for name in BUILTIN_TRACES)]
        raise InputError(f"{unknown_name('workload', text, known)}; nor is it a trace file (no such file)")
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


def resolve_arrivals(config: RunConfig) -> RunConfig:
    """``config`` with its arrival process explicit, and its rate too unless the
    arrivals are a trace's recorded times left as recorded (``rate_per_s`` None).

    Raises:
        InputError: as ``ampd.run.resolve.rate_for``.
    """
    w = config.workload
    workload = {"arrivals": w.arrival_process}
    if w.arrival_process == "poisson":
        workload["rate_per_s"] = rate_for(config)
    return override(config, workload=workload)


def resolve(config: RunConfig) -> RunConfig:
    """``config`` ready to run and to save: arrivals, thresholds, measurement and
    deployment explicit."""
    # The deployment before the measurement: a capacity-refined plan searches other rates,
    # each with its own window (search_capacities).
    return resolve_measure(resolve_deployment(resolve_slo(resolve_arrivals(config))))


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
        InputError: an invalid system, workload or rate; a point that could not
            run (``experiment.check_runnable``); capacities asked of transient runs.
    """
    if sweep.capacity and (base.workload.num_sessions is not None
                           or any(w.num_sessions is not None for w in sweep.workloads)):
        raise InputError("capacity needs steady-state runs: leave workload.num_sessions (--num-sessions) unset")
    configs = []
    for w in sweep.workloads:
        extra = {k: v for k, v in (("arrivals", w.arrivals), ("num_sessions", w.num_sessions)) if v is not None}
        first = override(base, workload={**workload_source(w.workload), **extra, "rate_per_s": min(w.rates_per_s)})
        resolved = resolve_slo(first)
        for system in sweep.systems:
            cluster = {"deployment": sweep.deployments[system]} if system in sweep.deployments else {}
            planned = _planned(override(resolved, system=system, cluster=cluster), w.rates_per_s)
            check_runnable(planned)
            for rate in w.rates_per_s:
                configs.append(override(planned, workload={"rate_per_s": rate}))
    return configs


def capacity_row(base: RunConfig, search: CapacitySearch) -> dict:
    """A capacity as a row: what ran, the ``target`` attainment, every run of the
    search (``runs``: rate, attainment, verdict, reason), ``capacity_per_s``,
    ``capacity_per_gpu``, the bracket's upper end ``above_per_s`` (the lowest rate
    measured not to meet the SLO; None when the search found none), ``bounded`` and
    ``num_runs``."""
    return {"workload": base.workload.label, "system": base.system, "deployment": base.cluster.deployment,
            "target_attainment": search.target,
            "runs": [{k: r[k] for k in ("rate_per_s", "slo_attainment", "verdict", "reason")} for r in search.rows],
            "num_gpus": base.cluster.num_gpus, "capacity_per_s": search.capacity_per_s,
            "capacity_per_gpu": search.capacity_per_s / base.cluster.num_gpus, "above_per_s": search.high_per_s,
            "bounded": search.bounded, "num_runs": len(search.rows)}


def sweep_capacities(sweep: SweepConfig, configs: Sequence[RunConfig], rows: Sequence[dict],
                     run: PointRunner) -> list[dict]:
    """The capacity of every (workload entry, system) of a sweep whose points are
    ``configs`` (``plan_sweep``'s order) with ``rows``: one ``capacity_row`` each,
    keeping the attainment the workload asks (its ``capacity_attainment``, else the
    sweep's), each search seeded with that entry's points."""
    bases, seeds, targets = [], [], []
    index = 0
    for w in sweep.workloads:
        for _ in sweep.systems:
            points = range(index, index + len(w.rates_per_s))
            index = points.stop
            bases.append(configs[points.start])
            seeds.append([rows[i] for i in points])
            targets.append(w.capacity_attainment or sweep.capacity_attainment)
    searches = search_capacities(bases, seeds, run, targets=targets)
    return [capacity_row(b, s) for b, s in zip(bases, searches)]
