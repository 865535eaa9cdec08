"""Transient against steady-state measurement, side by side in one run (issue:
"Steady-state evaluation"; AMPD.md section 6).

Two cells, three systems (``ampd-predictive``, ``dynamo-busy``, ``pd-disagg``):
- GAIA, Llama-3.1-70B on 32 x H20, ``P:<TP=4,DP=5> D:<TP=4,DP=3>``, at 2.28 sessions/s
  (the old grid's rate for the cell);
- ToolBench, Llama-3.1-70B on 8 x H20, ``P:<TP=2,DP=2> D:<TP=4,DP=1>`` (the demo's
  deployment [our choice]: the old table named none), at 1.28 sessions/s.

For each system and cell: the old way (a fixed number of sessions: 200/400/800 for GAIA,
300/1,200 for ToolBench; the figure drifts with the count), the steady-state run at the
old rate (its verdict), the system's capacity (``ampd.measure.capacity``: highest rate
with >= 90 % attainment in a stable run), and at that capacity the attainment over the
window's first half (T) and over all of it (2T), plus an independent run with the window
doubled. Every stable point differs by <= 2 points between T and 2T by the verdict's
definition; the doubled window checks that from a separate run.

Run: ``python bench/bench_steady_state.py`` -> ``bench/results/steady_state.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from ampd.config import RunConfig, override  # noqa: E402
from ampd.run.runner import PointRunner  # noqa: E402
from ampd.run.capacity_search import search_capacities  # noqa: E402
from ampd.run.sweep import capacity_row, resolve_measure, resolve_slo  # noqa: E402

SYSTEMS = ("ampd-predictive", "dynamo-busy", "pd-disagg")
CELLS = {
    "gaia": {"num_gpus": 32, "deployment": "P:<TP=4,DP=5> D:<TP=4,DP=3>", "rate_per_s": 2.28,
             "session_counts": (200, 400, 800)},
    "toolbench": {"num_gpus": 8, "deployment": "P:<TP=2,DP=2> D:<TP=4,DP=1>", "rate_per_s": 1.28,
                  "session_counts": (300, 1200)},
}
POINT_KEYS = ("rate_per_s", "slo_attainment", "attainment_half", "verdict", "reason", "slowdown_growth",
              "num_sessions", "warmup_s", "window_s", "ttft_p95_s", "itl_p95_s", "local_prefill_share")


def _base(workload: str, system: str) -> RunConfig:
    cell = CELLS[workload]
    return resolve_slo(override(RunConfig(), system=system,
                                cluster={"num_gpus": cell["num_gpus"], "deployment": cell["deployment"]},
                                workload={"name": workload, "rate_per_s": cell["rate_per_s"]}))


def _point(row: dict) -> dict:
    return {k: row.get(k) for k in POINT_KEYS}


def main() -> None:
    start = time.perf_counter()
    run = PointRunner(progress=True)
    keys = [(w, s) for w in CELLS for s in SYSTEMS]
    bases = {k: _base(*k) for k in keys}
    transient = {k: [override(bases[k], workload={"num_sessions": n}) for n in CELLS[k[0]]["session_counts"]]
                 for k in keys}
    transient_rows = run([c for k in keys for c in transient[k]])
    steady_rows = run([bases[k] for k in keys])
    searches = search_capacities([bases[k] for k in keys], [[r] for r in steady_rows], run)
    at_capacity = [resolve_measure(override(bases[k], workload={"rate_per_s": s.capacity_per_s}))
                   for k, s in zip(keys, searches)]
    doubled = run([override(c, measure={"window_s": 2 * c.measure.window_s, "drain_s": None}) for c in at_capacity])
    capacity_rows = run(at_capacity)
    cells, rows = {}, iter(transient_rows)
    for i, (workload, system) in enumerate(keys):
        counts = CELLS[workload]["session_counts"]
        cap = capacity_row(bases[(workload, system)], searches[i])
        point = capacity_rows[i]
        cells.setdefault(workload, {**CELLS[workload], "systems": {}})["systems"][system] = {
            "transient": [{"num_sessions": n, "slo_attainment": next(rows)["slo_attainment"]} for n in counts],
            "steady_at_old_rate": _point(steady_rows[i]),
            "capacity": cap,
            "at_capacity": {**_point(point), "attainment_T": point["attainment_half"],
                            "attainment_2T": point["slo_attainment"],
                            "attainment_doubled_window": doubled[i]["slo_attainment"],
                            "doubled_window_verdict": doubled[i]["verdict"]},
        }
        print(f"{workload} {system}: transient " + ", ".join(
            f"{t['num_sessions']}: {100 * t['slo_attainment']:.1f}%"
            for t in cells[workload]["systems"][system]["transient"])
            + f"; steady at {CELLS[workload]['rate_per_s']}/s: {steady_rows[i]['verdict']}"
            + f"; capacity {cap['capacity_per_s']:.3g}/s: T {100 * point['attainment_half']:.1f}% "
              f"2T {100 * point['slo_attainment']:.1f}% ({point['verdict']}), doubled window "
              f"{100 * doubled[i]['slo_attainment']:.1f}%", flush=True)
    stable = [s["at_capacity"] for c in cells.values() for s in c["systems"].values()
              if s["at_capacity"]["verdict"] == "stable"]
    write_result("steady_state", {
        "model": "Llama-3.1-70B", "gpu": "H20", "systems": list(SYSTEMS), "cells": cells,
        "max_gap_T_2T_points_stable": max(100 * abs(p["attainment_T"] - p["attainment_2T"]) for p in stable),
        "max_gap_doubled_window_points_stable": max(100 * abs(p["attainment_doubled_window"] - p["attainment_2T"])
                                                    for p in stable),
        "wall_s": time.perf_counter() - start})


if __name__ == "__main__":
    main()
