"""``ampd plan`` on every paper workload at 8, 32 and 256 GPUs, at 0.8 x each cell's
capacity, timed as a user runs it (issue 37): the whole command's wall time and the
planning time it prints, side by side with a baseline checkout of the project in the
same run, and whether the two give the same plans.

Capacity of a cell: the highest arrival rate at which the planner's best plan keeps
Z <= 1 (both P95s within their thresholds, by the planner's own estimate), found by
bisection on the planner as ``ampd plan`` runs it (``ampd.run.planning.plan_for``, the
default system and its steady-state window), to ``CAPACITY_TOLERANCE``.
[our choice] the planner's own capacity: a simulated one at 256 GPUs would take hours
here, and the figure only sets the load the timing is taken at.

Model and GPU: Llama-3.1-70B on H20 (the paper's). Each wall time is the median of
``REPEATS`` runs of ``ampd plan`` in a fresh process (imports, the workload's sessions,
the planner, the table), baseline and candidate alternating.

Run: ``python bench/bench_planner_workloads.py [--baseline-src DIR]`` ->
``bench/results/planner_workloads.json``. ``DIR``: the ``src`` folder of another
checkout (``git worktree add /tmp/before <rev>``), run with the same interpreter.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, write_result  # noqa: E402

from ampd.cli.main import build_parser  # noqa: E402
from ampd.cli.plan import plan_config  # noqa: E402
from ampd.core.errors import InputError  # noqa: E402
from ampd.run.planning import plan_for  # noqa: E402

MODEL, GPU = "Llama-3.1-70B", "H20"
WORKLOADS = ("toolbench", "hotpotqa", "dureader", "gaia")
SIZES = (8, 32, 256)
LOAD = 0.8
CAPACITY_TOLERANCE = 0.03
REPEATS = 3
_CLI = "import sys; from ampd.cli.main import main; sys.exit(main())"


def _arguments(workload: str, num_gpus: int, rate_per_s: float) -> list[str]:
    """``ampd plan``'s arguments for a cell."""
    return ["plan", "--model", MODEL, "--gpu", GPU, "--gpus", str(num_gpus), "--workload", workload,
            "--rate", f"{rate_per_s:.6g}"]


def _best_z(workload: str, num_gpus: int, rate_per_s: float) -> float:
    try:
        config = plan_config(build_parser().parse_args(_arguments(workload, num_gpus, rate_per_s)))
        return plan_for(config, top_k=1)[0].objective
    except InputError:  # no feasible plan: overloaded
        return float("inf")


def capacity_per_s(workload: str, num_gpus: int) -> float:
    """The planner's capacity of a cell (module docstring), sessions/s."""
    low, high = 0.0, 0.25 * num_gpus / 8
    while _best_z(workload, num_gpus, high) <= 1.0:
        low, high = high, 2.0 * high
    while high - low > CAPACITY_TOLERANCE * high:
        mid = 0.5 * (low + high)
        low, high = (mid, high) if _best_z(workload, num_gpus, mid) <= 1.0 else (low, mid)
    return low


def _plan_once(src: Path, workload: str, num_gpus: int, rate_per_s: float) -> tuple[float, dict]:
    """Wall seconds of one ``ampd plan`` with the package at ``src``, and its plans.json."""
    with tempfile.TemporaryDirectory() as out:
        command = [sys.executable, "-c", _CLI, *_arguments(workload, num_gpus, rate_per_s), "--out", out]
        env = {**os.environ, "PYTHONPATH": str(src)}
        start = time.perf_counter()
        subprocess.run(command, env=env, check=True, capture_output=True, text=True)
        wall_s = time.perf_counter() - start
        return wall_s, json.loads((Path(out) / "plans.json").read_text())


def _timed(sources: dict[str, Path], workload: str, num_gpus: int, rate_per_s: float) -> dict:
    walls: dict[str, list[float]] = {name: [] for name in sources}
    plans: dict[str, list[dict]] = {name: [] for name in sources}
    for _ in range(REPEATS):
        for name, src in sources.items():
            wall_s, result = _plan_once(src, workload, num_gpus, rate_per_s)
            walls[name].append(wall_s)
            plans[name].append(result)
    row = {}
    for name in sources:
        runs = plans[name]
        row[name] = {"wall_s": statistics.median(walls[name]),
                     "planning_s": statistics.median(r["planning_s"] for r in runs),
                     "plans": [{"deployment": _label(p), "objective": p["objective"]} for p in runs[0]["plans"]]}
    return row


def _label(plan: dict) -> str:
    return " ".join(f"{c['role']}:<TP={c['tp']},DP={c['dp']}>" + "".join(
        f"+<TP={g['tp']},DP={g['dp']}>" for g in c["extra"]) for c in (plan["prefill"], plan["decode"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path, help="src folder of a baseline checkout, timed beside this one")
    args = parser.parse_args()
    sources = {"candidate": ROOT / "src"}
    if args.baseline_src:
        sources = {"baseline": args.baseline_src.resolve(), **sources}
    cells = []
    for num_gpus in SIZES:
        for workload in WORKLOADS:
            capacity = capacity_per_s(workload, num_gpus)
            rate = LOAD * capacity
            row = {"workload": workload, "num_gpus": num_gpus, "capacity_per_s": capacity, "rate_per_s": rate,
                   **_timed(sources, workload, num_gpus, rate)}
            if "baseline" in row:
                row["same_plans"] = row["baseline"]["plans"] == row["candidate"]["plans"]
            cells.append(row)
            print(f"{workload:9s} {num_gpus:3d} GPUs at {rate:.3g}/s: " + "; ".join(
                f"{name} wall {row[name]['wall_s']:.2f} s, planning {row[name]['planning_s']:.2f} s"
                for name in sources) + (f"; same plans {row['same_plans']}" if "same_plans" in row else ""),
                flush=True)
    baseline = None
    if args.baseline_src:
        baseline = subprocess.run(["git", "-C", str(args.baseline_src), "rev-parse", "HEAD"], check=True,
                                  capture_output=True, text=True).stdout.strip()
    write_result("planner_workloads", {"model": MODEL, "gpu": GPU, "load": LOAD, "repeats": REPEATS,
                                       "capacity_tolerance": CAPACITY_TOLERANCE, "baseline_commit": baseline,
                                       "cells": cells})


if __name__ == "__main__":
    main()
