"""Mixed TP degrees on the decode side (``[planner] mixed_degrees``; docs/PLANNER.md,
"Mixed degrees") on the reproduce grid: for each of its 12 cells, the planner's top 5
for ``ampd-slo`` drawn at its knee (what ``ampd reproduce``'s ``ampd-slo [planner]``
row ranks by simulated capacity, ``grid.PLANNER_OPTIONS``) with one degree per role
and with mixed decode sides, each plan's Z and both taus, the knee itself, and the
planning time of each (knee search and top 5, one after the other in one process).

Where a mixed plan enters the top 5, both top-5 lists are simulated to their capacity
(``plan_simulation.simulate_capacities``, the point cache of ``ampd reproduce``) and
the capacity-ranked pick of each is recorded; where none does, the refined pick is the
same plan and nothing is simulated.

Run: ``python bench/bench_planner_mixed.py [--jobs N]`` -> ``bench/results/planner_mixed.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPRODUCE_OUT, jobs_parser, write_result  # noqa: E402

from ampd.config import override  # noqa: E402
from ampd.core.deployment import Deployment  # noqa: E402
from ampd.run.plan_refine import simulate_capacities  # noqa: E402
from ampd.run.planning import knee_rate_per_s, plan_for  # noqa: E402
from ampd.reproduce import grid  # noqa: E402
from ampd.reproduce.run import prepare  # noqa: E402
from ampd.run.runner import PointRunner  # noqa: E402

SYSTEM = "ampd-slo"
TOP_K = grid.PLANNER_OPTIONS[SYSTEM]["refine_top_k"]


def _knee_top(config) -> dict:
    started = time.perf_counter()
    knee_per_s = knee_rate_per_s(config)
    plans = plan_for(override(config, workload={"rate_per_s": knee_per_s}), top_k=TOP_K)
    return {"knee_rate_per_s": knee_per_s, "planning_s": time.perf_counter() - started,
            "plans": [{"deployment": str(p.deployment), "objective": p.objective, "tau_pre": p.prefill.tau,
                       "tau_dec": p.decode.tau, "mixed": bool(p.decode.extra)} for p in plans]}


def main() -> None:
    parser = jobs_parser(__doc__)
    args = parser.parse_args()
    started = time.perf_counter()
    run = PointRunner(args.jobs, True, REPRODUCE_OUT / "points")
    rows = []
    for p in prepare(grid.cells(quick=False), run):
        config = override(p.config, system=SYSTEM, cluster={"deployment": "auto"})
        one = _knee_top(config)
        mixed = _knee_top(override(config, planner={"mixed_degrees": True}))
        row = {"cell": p.cell.label, "reference_per_s": p.reference_per_s, "one_degree": one, "mixed": mixed,
               "mixed_in_top": sum(q["mixed"] for q in mixed["plans"]),
               "binding_side_of_best": "prefill" if one["plans"][0]["tau_pre"] >= one["plans"][0]["tau_dec"]
               else "decode"}
        if row["mixed_in_top"]:
            for option in (one, mixed):
                names = [q["deployment"] for q in option["plans"]]
                capacities = simulate_capacities(config, [Deployment.parse(n) for n in names], run)
                for q, capacity in zip(option["plans"], capacities):
                    q["capacity_per_s"] = capacity
                option["refined_pick"] = names[capacities.index(max(capacities))]
        rows.append(row)
        print(f"{p.cell.label}: knee {one['knee_rate_per_s']:.3f} / {mixed['knee_rate_per_s']:.3f} /s, "
              f"{row['mixed_in_top']} mixed in the top {TOP_K}, best binds on {row['binding_side_of_best']}, "
              f"planning {one['planning_s']:.1f} / {mixed['planning_s']:.1f} s", flush=True)
    write_result("planner_mixed", {
        "system": SYSTEM, "top_k": TOP_K, "cells": rows,
        "cells_with_a_mixed_plan_in_the_top": sum(r["mixed_in_top"] > 0 for r in rows),
        "cells_binding_on_prefill": sum(r["binding_side_of_best"] == "prefill" for r in rows),
        "num_cells": len(rows), "wall_s": time.perf_counter() - started})


if __name__ == "__main__":
    main()
