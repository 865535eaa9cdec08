"""The planner's deployment for ``ampd-slo`` ranked by capacity: on the reproduce
grid's 8- and 16-GPU cells (3 models x ToolBench, HotpotQA, DuReader on H20), the
capacity of the planner's own pick at the cell's reference rate (the ILP's first plan)
against the pick of ``[planner] refine_top_k = 5, refine_by = "capacity"``
(``ampd.run.planning.plan_for``: the ILP's top 5 drawn at the planner's knee, the highest
rate its best plan keeps Z <= 1, ranked by capacity; what ``ampd reproduce`` runs as
``ampd-slo [planner]``, ``grid.PLANNER_OPTIONS``), beside every baseline's capacity on its best searched deployment,
and ``ampd-slo``'s on the best baseline's deployment, all from one run of the same
code (``ampd.reproduce.run``: thresholds, reference rate, deployment search and
capacity search as the grid runs them; the point cache of ``ampd reproduce`` answers
what it already ran). Every capacity is searched from the reference rate, to 5 %.

GAIA's 32-GPU cells are left out: each of their runs costs tens of the small cells'.

Run: ``python bench/bench_planner_capacity.py [--jobs N]`` -> ``bench/results/planner_capacity.json``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPRODUCE_OUT, jobs_parser, write_result  # noqa: E402

from ampd.config import override  # noqa: E402
from ampd.run.plan_refine import simulate_capacities  # noqa: E402
from ampd.run.planning import knee_rate_per_s, plan_for  # noqa: E402
from ampd.reproduce import grid  # noqa: E402
from ampd.reproduce.run import grid_entries, prepare, run_capacities, search_best  # noqa: E402
from ampd.run.runner import PointRunner  # noqa: E402

SYSTEM = "ampd-slo"
TOP_K = 5


def main() -> None:
    parser = jobs_parser(__doc__)
    args = parser.parse_args()
    started = time.perf_counter()
    run = PointRunner(args.jobs, True, REPRODUCE_OUT / "points")
    cells = prepare([c for c in grid.cells(quick=False) if c.num_gpus <= 16], run)
    best = search_best(cells, run, quick=False)
    baselines = {key: chosen for key, chosen in best.items()
                 if key[1] in grid.DISAGGREGATED + grid.COLOCATED and not key[1].startswith("ampd")}
    baseline_rows = run_capacities(grid_entries(cells, baselines), [], run)
    rows = []
    for p in cells:
        config = override(p.config, system=SYSTEM, cluster={"deployment": "auto"})
        planned = plan_for(config, top_k=1)[0]
        knee_per_s = knee_rate_per_s(config)
        drawn = plan_for(override(config, workload={"rate_per_s": knee_per_s}), top_k=TOP_K)
        refined = plan_for(override(config, planner={"refine_top_k": TOP_K, "refine_by": "capacity"}), 1,
                           runner=run)[0]
        others = {r["system"]: r["capacity_per_s"] for r in baseline_rows if r["cell"] == p.cell.label}
        best_baseline = max(others, key=others.get)
        theirs = best[(p.cell.label, best_baseline)][0]
        [planned_cap, *drawn_caps, on_theirs] = simulate_capacities(
            config, [planned.deployment, *(d.deployment for d in drawn), theirs], run)
        refined_cap = drawn_caps[[str(d.deployment) for d in drawn].index(str(refined.deployment))]
        rows.append({
            "cell": p.cell.label, "reference_per_s": p.reference_per_s, "knee_rate_per_s": knee_per_s,
            "planner_deployment": str(planned.deployment), "planner_capacity_per_s": planned_cap,
            "knee_plans": [{"deployment": str(d.deployment), "objective": d.objective, "capacity_per_s": c}
                           for d, c in zip(drawn, drawn_caps)],
            "refined_deployment": str(refined.deployment), "refined_capacity_per_s": refined_cap,
            "baselines": {s: {"deployment": str(best[(p.cell.label, s)][0]), "capacity_per_s": c}
                          for s, c in others.items()},
            "best_baseline": best_baseline, "best_baseline_capacity_per_s": others[best_baseline],
            "system_on_best_baseline_deployment_per_s": on_theirs,
            "planner_highest": planned_cap > others[best_baseline],
            "refined_highest": refined_cap > others[best_baseline]})
        print(f"{p.cell.label}: planner {planned.deployment} {planned_cap:.3f}/s, refined {refined.deployment} "
              f"{refined_cap:.3f}/s, best baseline {best_baseline} {others[best_baseline]:.3f}/s", flush=True)
    write_result("planner_capacity", {
        "system": SYSTEM, "top_k": TOP_K, "cells": rows,
        "planner_highest_cells": sum(r["planner_highest"] for r in rows),
        "refined_highest_cells": sum(r["refined_highest"] for r in rows), "num_cells": len(rows),
        # means over the cells of per-cell ratios
        "refined_over_best_baseline": statistics.fmean(r["refined_capacity_per_s"] / r["best_baseline_capacity_per_s"]
                                                       for r in rows),
        "refined_over_planner": statistics.fmean(r["refined_capacity_per_s"] / r["planner_capacity_per_s"]
                                                 for r in rows),
        "wall_s": time.perf_counter() - started})


if __name__ == "__main__":
    main()
