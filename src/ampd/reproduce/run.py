"""The stages of ``ampd reproduce``: thresholds and rates per cell, each system's
best deployment, the grid, the ablation and the sensitivity. Every simulation is
cached by its configuration under ``<out>/points/``, so a run resumes where an
interruption left it and a second run only re-draws the figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ampd.config import RunConfig, override
from ampd.core.deployment import Deployment
from ampd.core.errors import InputError
from ampd.experiment import perf_model_for, sessions_for
from ampd.perf.interface import PerfModel
from ampd.planning import resolve_deployment
from ampd.policy.systems import SYSTEMS
from ampd.reproduce import grid
from ampd.reproduce.capacity import find_knees, prefill_bound_rate_per_s
from ampd.reproduce.deployments import colocated_candidates, disaggregated_candidates
from ampd.reproduce.search import coarse, pick_best, same_pair
from ampd.slo_rule import reference_tp
from ampd.runner import PointRunner as Runner
from ampd.sweep import resolve_slo


@dataclass(frozen=True)
class Prepared:
    """A cell ready to run: its configuration (thresholds resolved), its knee rate
    (sessions/s; the grid's rates are multiples of it) and performance model."""

    cell: grid.Cell
    config: RunConfig
    knee_per_s: float
    perf: PerfModel


def prepare(cells: list[grid.Cell], run: "Runner") -> list[Prepared]:
    """Thresholds (from each cell's sessions at its prefill-bound rate) and knees
    (``capacity.find_knees``, plain PD disaggregation on an even split)."""
    configs, bounds, perfs = [], [], []
    for cell in cells:
        config = override(RunConfig(), cluster={"model": cell.model, "num_gpus": cell.num_gpus},
                          workload={"name": cell.workload, "num_sessions": cell.num_sessions, "rate_per_s": 1.0})
        perf = perf_model_for(config)
        bound = prefill_bound_rate_per_s(perf, sessions_for(config), cell.num_gpus)
        config = resolve_slo(override(config, workload={"rate_per_s": bound}))
        even = _even_split(perf, cell.num_gpus)
        configs.append(override(config, system="pd-disagg", cluster={"deployment": str(even)}))
        bounds.append(bound)
        perfs.append(perf)
    knees = find_knees(configs, bounds, run)
    return [Prepared(cell, override(config, workload={"rate_per_s": knee}), knee, perf)
            for cell, config, knee, perf in zip(cells, configs, knees, perfs)]


def _even_split(perf: PerfModel, num_gpus: int) -> Deployment:
    """Half the GPUs prefilling, both roles at the SLO rule's reference TP (or the
    nearest usable pair)."""
    ref = reference_tp(perf)
    options = coarse(disaggregated_candidates(perf, num_gpus), num_gpus)
    return min(options, key=lambda d: sum(abs(g.tp - ref) for g in d.groups))


def search_best(cells: list[Prepared], run: Runner) -> dict[tuple[str, str], tuple[Deployment, str]]:
    """Each (cell label, system label)'s deployment and how it was chosen: the
    search (``search.py``) for every system, and for the AMPD family also the
    planner's best plan at the knee, under the label ``<system> [planner]`` (issue:
    experiments use the planner's choice for AMPD), when the planner finds a
    feasible plan."""
    planned, searches, pools = {}, {}, {}
    for p in cells:
        pd_all = disaggregated_candidates(p.perf, p.cell.num_gpus)
        for system in grid.DISAGGREGATED:
            key = (p.cell.label, system)
            pools[key] = pd_all
            searches[key] = (override(p.config, system=system), coarse(pd_all, p.cell.num_gpus))
            plan = _planned(p, system) if SYSTEMS[system].adaptive else None
            if plan is not None:
                planned[(p.cell.label, system + grid.PLANNED)] = (plan, "planner")
        for system in grid.COLOCATED:
            searches[(p.cell.label, system)] = (override(p.config, system=system),
                                                colocated_candidates(p.perf, p.cell.num_gpus))
    best = pick_best(searches, run)
    best.update(pick_best({key: (searches[key][0], same_pair(pool, best[key])) for key, pool in pools.items()}, run))
    return {**{key: (d, "search") for key, d in best.items()}, **planned}


def _planned(p: Prepared, system: str) -> Deployment | None:
    try:
        config = resolve_deployment(override(p.config, system=system, cluster={"deployment": "auto"}))
    except InputError:
        return None
    return Deployment.parse(config.cluster.deployment)


def _at(p: Prepared, system: str, deployment: Deployment, fraction: float, **policy) -> RunConfig:
    return override(p.config, system=system, cluster={"deployment": str(deployment)},
                    workload={"rate_per_s": p.knee_per_s * fraction}, **({"policy": policy} if policy else {}))


def _annotate(rows: list[dict], labels: list[dict]) -> list[dict]:
    return [{**label, **row} for label, row in zip(labels, rows)]


def run_grid(cells: list[Prepared], best: dict, fractions: Sequence[float], run: Runner) -> list[dict]:
    """Every system label of ``best`` on its deployment at every rate of every cell;
    rows carry the label as ``system``."""
    configs, labels = [], []
    for p in cells:
        for (cell, label), (deployment, _) in best.items():
            if cell != p.cell.label:
                continue
            for f in fractions:
                configs.append(_at(p, label.removesuffix(grid.PLANNED), deployment, f))
                labels.append({"cell": cell, "rate_fraction": f, "label": label})
    rows = run(configs)
    return [{**row, "cell": lab["cell"], "rate_fraction": lab["rate_fraction"], "system": lab["label"]}
            for row, lab in zip(rows, labels)]


def run_ablation(cells: list[Prepared], best: dict, fractions: Sequence[float], run: Runner) -> list[dict]:
    """AMPD, without reordering, and without routing and reordering, all on AMPD's
    searched deployment."""
    configs, labels = [], []
    for p in cells:
        for system in grid.ABLATION:
            for f in fractions:
                configs.append(_at(p, system, best[(p.cell.label, "ampd")][0], f))
                labels.append({"cell": p.cell.label, "rate_fraction": f})
    return _annotate(run(configs), labels)


def run_sensitivity(cells: list[Prepared], best: dict, run: Runner) -> list[dict]:
    """AMPD at the search rate with w, alpha and beta varied one at a time."""
    knobs = ([("reorder_window", w) for w in grid.WINDOWS] + [("alpha", a) for a in grid.ALPHAS]
             + [("beta", b) for b in grid.BETAS])
    configs, labels = [], []
    for p in cells:
        for name, value in knobs:
            configs.append(_at(p, "ampd", best[(p.cell.label, "ampd")][0], grid.SEARCH_FRACTION, **{name: value}))
            labels.append({"cell": p.cell.label, "knob": name, "value": value})
    return _annotate(run(configs), labels)
