"""The stages of ``ampd reproduce``, every run a steady-state run (AMPD.md
section 6): thresholds and the reference capacity per cell, each system's best
deployment, the grid of rates, each system's capacity, the ablation and the
sensitivity. Every simulation is cached by its configuration under
``<out>/points/``, so a run resumes where an interruption left it and a second
run only re-draws the figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ampd.run.capacity_search import search_capacities
from ampd.config import RunConfig, override
from ampd.core.deployment import Deployment
from ampd.core.errors import InputError
from ampd.run.resolve import measure_for, perf_model_for, sample_sessions
from ampd.perf.interface import PerfModel
from ampd.run.planning import plan_for
from ampd.policy.systems import SYSTEMS
from ampd.reproduce import grid
from ampd.reproduce.capacity import prefill_bound_rate_per_s
from ampd.reproduce.deployments import colocated_candidates, disaggregated_candidates
from ampd.reproduce.search import coarse, pick_best, same_pair
from ampd.run.runner import PointRunner
from ampd.run.slo_rule import reference_tp
from ampd.run.sweep import capacity_row, resolve_slo

@dataclass(frozen=True)
class Prepared:
    """A cell ready to run: its configuration (thresholds resolved), its reference
    capacity (sessions/s: the capacity of plain PD disaggregation on an even split;
    the grid's rates are multiples of it), whether that system met the SLO at
    any rate (if not, the reference is the lowest rate tried), and its
    performance model."""

    cell: grid.Cell
    config: RunConfig
    reference_per_s: float
    reference_met_slo: bool
    perf: PerfModel


def prepare(cells: list[grid.Cell], run: PointRunner) -> list[Prepared]:
    """Thresholds (from each cell's sample sessions) and reference capacities
    (searched from the prefill-bound rate, ``capacity.prefill_bound_rate_per_s``)."""
    configs, bounds, perfs = [], [], []
    for cell in cells:
        cluster = {"model": cell.model, "num_gpus": cell.num_gpus, "perf_model": cell.perf_model}
        if cell.perf_model is None:  # a perf model file names its own GPU
            cluster["gpu"] = grid.GPU
        config = resolve_slo(override(RunConfig(), cluster=cluster,
                                      workload={"name": cell.workload, "rate_per_s": 1.0}))
        perf = perf_model_for(config)
        bounds.append(prefill_bound_rate_per_s(perf, sample_sessions(config), cell.num_gpus))
        configs.append(override(config, system="pd-disagg", cluster={"deployment": str(_even_split(perf, cell.num_gpus))}))
        perfs.append(perf)
    searches = search_capacities(configs, [[] for _ in configs], run, bounds)
    prepared = []
    for cell, config, search, perf in zip(cells, configs, searches, perfs):
        met = search.capacity_per_s > 0
        reference = search.capacity_per_s if met else min(r["rate_per_s"] for r in search.rows)
        prepared.append(Prepared(cell, override(config, workload={"rate_per_s": reference}), reference, met, perf))
    return prepared


def _even_split(perf: PerfModel, num_gpus: int) -> Deployment:
    """Half the GPUs prefilling, both roles at the SLO rule's reference TP (or the
    nearest usable pair)."""
    ref = reference_tp(perf)
    options = coarse(disaggregated_candidates(perf, num_gpus), num_gpus)
    return min(options, key=lambda d: sum(abs(g.tp - ref) for g in d.groups))


def search_best(cells: list[Prepared], run: PointRunner, quick: bool) -> dict[tuple[str, str], tuple[Deployment, str]]:
    """Each (cell label, system label)'s deployment and how it was chosen: the
    search (``search.py``) for every system, at the reference capacity, and for the
    AMPD family also the planner's best plan there (with the system's
    ``grid.PLANNER_OPTIONS``), under the label ``<system> [planner]`` (experiments
    use the planner's choice for AMPD), when the planner finds a feasible plan. Candidates are ranked on shorter runs
    (``_screening``). With ``quick``, the coarse search only."""
    disaggregated, colocated = grid.systems(quick)
    planned, searches, pools = {}, {}, {}
    for p in cells:
        pd_all = disaggregated_candidates(p.perf, p.cell.num_gpus)
        screening = _screening(p.config)
        for system in disaggregated:
            key = (p.cell.label, system)
            pools[key] = pd_all
            searches[key] = (override(screening, system=system), coarse(pd_all, p.cell.num_gpus))
            plan = _planned(p, system, run) if SYSTEMS[system].adaptive else None
            if plan is not None:
                planned[(p.cell.label, system + grid.PLANNED)] = (plan, planned_by(system))
        for system in colocated:
            searches[(p.cell.label, system)] = (override(screening, system=system),
                                                colocated_candidates(p.perf, p.cell.num_gpus))
    best = pick_best(searches, run)
    if not quick:
        best.update(pick_best({key: (searches[key][0], same_pair(pool, best[key])) for key, pool in pools.items()},
                              run))
    return {**{key: (d, "search") for key, d in best.items()}, **planned}


def _screening(config: RunConfig) -> RunConfig:
    """``config`` measured over ``grid.SCREEN_WINDOW_SHARE`` of its window, for ranking
    candidate deployments."""
    plan = measure_for(config)
    return override(config, measure={"window_s": grid.SCREEN_WINDOW_SHARE * plan.window_s})


def _planned(p: Prepared, system: str, run: PointRunner) -> Deployment | None:
    """The planner's first plan for ``system`` in cell ``p`` with its
    ``grid.PLANNER_OPTIONS`` (a refinement's simulations through ``run``, so they
    are cached with the grid's); None when the planner finds no feasible plan."""
    config = override(p.config, system=system, cluster={"deployment": "auto"},
                      planner=grid.PLANNER_OPTIONS.get(system, {}))
    try:
        return plan_for(config, top_k=1, runner=run)[0].deployment
    except InputError:
        return None


def planned_by(system: str) -> str:
    """How a ``[planner]`` row's deployment was chosen, as the tables say it:
    ``planner`` (the ILP's first plan) or ``planner, top <k> by <ranking>``."""
    options = grid.PLANNER_OPTIONS.get(system)
    if not options:
        return "planner"
    return f"planner, top {options['refine_top_k']} by {options['refine_by']}"


def _at(p: Prepared, system: str, deployment: Deployment, fraction: float, **policy) -> RunConfig:
    return override(p.config, system=system, cluster={"deployment": str(deployment)},
                    workload={"rate_per_s": p.reference_per_s * fraction}, **({"policy": policy} if policy else {}))


def _annotate(rows: list[dict], labels: list[dict]) -> list[dict]:
    return [{**row, **label} for row, label in zip(rows, labels)]


Entry = tuple[Prepared, str, Deployment]  # a cell, a system label, its deployment


def grid_entries(cells: list[Prepared], best: dict) -> list[Entry]:
    """Every system label of ``best`` on its deployment, in every cell."""
    return [(p, label, deployment) for p in cells for (cell, label), (deployment, _) in best.items()
            if cell == p.cell.label]


def ablation_entries(cells: list[Prepared], best: dict) -> list[Entry]:
    """AMPD, without reordering, and without routing and reordering, all on AMPD's
    searched deployment (AMPD.md section 3)."""
    return [(p, system, best[(p.cell.label, "ampd")][0]) for p in cells for system in grid.ABLATION]


def run_points(entries: list[Entry], fractions: Sequence[float], run: PointRunner) -> list[dict]:
    """Each entry at every rate fraction of its cell's reference capacity; rows
    carry ``cell``, ``rate_fraction`` and the label as ``system``."""
    configs, labels = [], []
    for p, label, deployment in entries:
        for f in fractions:
            configs.append(_at(p, label.removesuffix(grid.PLANNED), deployment, f))
            labels.append({"cell": p.cell.label, "rate_fraction": f, "system": label})
    return _annotate(run(configs), labels)


def run_capacities(entries: list[Entry], rows: list[dict], run: PointRunner) -> list[dict]:
    """The capacity of every entry, each search seeded with the entry's ``rows``
    (same cell and label); rows carry ``cell``, the label as ``system`` and the
    cell's ``reference_per_s``."""
    bases, seeds, labels = [], [], []
    for p, label, deployment in entries:
        bases.append(_at(p, label.removesuffix(grid.PLANNED), deployment, 1.0))
        seeds.append([r for r in rows if r["cell"] == p.cell.label and r["system"] == label])
        labels.append({"cell": p.cell.label, "system": label, "reference_per_s": p.reference_per_s})
    searches = search_capacities(bases, seeds, run)
    return [{**capacity_row(b, s), **label} for b, s, label in zip(bases, searches, labels)]


def run_sensitivity(cells: list[Prepared], best: dict, run: PointRunner, quick: bool) -> list[dict]:
    """AMPD at the search rate with w, alpha and beta varied one at a time (``grid.knobs``)."""
    configs, labels = [], []
    for p in cells:
        for name, value in grid.knobs(quick):
            configs.append(_at(p, "ampd", best[(p.cell.label, "ampd")][0], grid.SEARCH_FRACTION, **{name: value}))
            labels.append({"cell": p.cell.label, "knob": name, "value": value})
    return _annotate(run(configs), labels)
