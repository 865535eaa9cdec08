"""Does ``ampd-slo`` win the reproduce grid by its router or by its deployment? The two
strongest baselines of the grid, plain PD disaggregation (``pd-disagg``) and Dynamo's busy
rule (``dynamo-busy``), run on the deployment ``ampd-slo [planner]`` runs in each cell (its
planner's capacity-ranked pick, ``grid.PLANNER_OPTIONS``), at the grid's rates and with
the grid's capacity search, exactly as ``ampd reproduce`` runs every system (the point
cache of the full run answers what it already ran). Beside them: every system's capacity
from that run, so a cell's verdict ("``ampd-slo`` has the highest capacity even against
the baselines moved onto its deployment") is read from one run of the same code.

The baselines' own deployments come from the grid's search, which ranks candidates by
attainment at the cell's reference rate (docs/RESULTS.md, "What still loses"); this is
the check that a deployment it did not find is not what the headline measures.

Needs the full grid in ``out/reproduce`` (``python bench/bench_reproduce.py --full``).

Run: ``python bench/bench_baselines_on_planned.py [--jobs N] [--max-gpus G]`` (``--max-gpus 16``
leaves out GAIA's 32-GPU cells, each of whose runs costs tens of the small cells') ->
``bench/results/baselines_on_planned.json``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import REPRODUCE_OUT, jobs_parser, write_result  # noqa: E402

from ampd.core.deployment import Deployment  # noqa: E402
from ampd.reproduce import grid  # noqa: E402
from ampd.reproduce.run import prepare, run_capacities, run_points  # noqa: E402
from ampd.run.runner import PointRunner  # noqa: E402

SYSTEM = "ampd-slo" + grid.PLANNED
BASELINES = ("pd-disagg", "dynamo-busy")  # the grid's strongest baselines by mean capacity


def main() -> None:
    parser = jobs_parser(__doc__)
    parser.add_argument("--max-gpus", type=int, default=None, help="only the cells of at most this many GPUs")
    args = parser.parse_args()
    started = time.perf_counter()
    results = json.loads((REPRODUCE_OUT / "results.json").read_text())
    capacities = {(c["cell"], c["system"]): c["capacity_per_s"] for c in results["capacities"]}
    planned = {b["cell"]: b["deployment"] for b in results["best_deployments"] if b["system"] == SYSTEM}
    run = PointRunner(args.jobs, True, REPRODUCE_OUT / "points")
    chosen = [c for c in grid.cells(quick=False) if args.max_gpus is None or c.num_gpus <= args.max_gpus]
    cells = [p for p in prepare(chosen, run) if p.cell.label in planned]
    entries = [(p, b, Deployment.parse(planned[p.cell.label])) for p in cells for b in BASELINES]
    moved = {(r["cell"], r["system"]): r["capacity_per_s"]
             for r in run_capacities(entries, run_points(entries, grid.RATE_FRACTIONS, run), run)}
    rows = []
    for p in cells:
        label = p.cell.label
        ours = capacities[(label, SYSTEM)]
        others = {s: c for (cell, s), c in capacities.items() if cell == label and not s.startswith("ampd")}
        on_ours = {b: moved[(label, b)] for b in BASELINES}
        best_other = max([*others.values(), *on_ours.values()])
        rows.append({"cell": label, "deployment": planned[label], "capacity_per_s": ours,
                     "baselines_searched_per_s": others, "baselines_on_this_deployment_per_s": on_ours,
                     "highest": ours >= best_other, "strictly_highest": ours > best_other,
                     "over_best_baseline": ours / best_other})
        print(f"{label}: {SYSTEM} {ours:.3f}/s on {planned[label]}; there "
              + ", ".join(f"{b} {c:.3f}" for b, c in on_ours.items()) + f"; best baseline anywhere {best_other:.3f}",
              flush=True)
    write_result("baselines_on_planned", {
        "system": SYSTEM, "baselines_moved": list(BASELINES), "run": "out/reproduce (ampd reproduce, full grid)",
        "max_gpus": args.max_gpus,
        "cells": rows, "highest_cells": sum(r["highest"] for r in rows),  # ties included
        "strictly_highest_cells": sum(r["strictly_highest"] for r in rows), "num_cells": len(rows),
        "wall_s": time.perf_counter() - started})


if __name__ == "__main__":
    main()
