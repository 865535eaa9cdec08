"""Simulator speed on the GAIA-like workload (11.3 rounds, 6161-token prompts) with
Llama-3.1-70B on simulated H20s, in steady state (AMPD.md section 6):

- 32 GPUs, ``P:<TP=4,DP=5> D:<TP=4,DP=3>``: the capacity of ``ampd-predictive`` is
  searched first (``ampd.measure``), then one hour of arrivals at that rate
  (600 s warm-up, 3,000 s window, then the drain) is timed: simulated seconds per
  wall second, sessions and events per wall second (target: the hour in <= 30 s);
- 256 GPUs, the same deployment eight times over, at eight times that rate:
  the same hour.

Run: ``python bench/bench_simulator.py`` -> ``bench/results/simulator.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from ampd.config import RunConfig, override  # noqa: E402
from ampd.run.resolve import measure_for, sessions_for  # noqa: E402
from ampd.run.simulate import simulate  # noqa: E402
from ampd.run.runner import PointRunner  # noqa: E402
from ampd.run.capacity_search import search_capacities  # noqa: E402

SYSTEM = "ampd-predictive"
DEPLOYMENTS = {32: "P:<TP=4,DP=5> D:<TP=4,DP=3>", 256: "P:<TP=4,DP=40> D:<TP=4,DP=24>"}
WARMUP_S, WINDOW_S = 600.0, 3000.0  # one hour of arrivals


def _config(num_gpus: int, rate_per_s: float, **measure) -> RunConfig:
    return override(RunConfig(), system=SYSTEM, cluster={"num_gpus": num_gpus, "deployment": DEPLOYMENTS[num_gpus]},
                    workload={"name": "gaia", "rate_per_s": rate_per_s}, measure=measure)


def _timed_hour(num_gpus: int, rate_per_s: float) -> dict:
    config = _config(num_gpus, rate_per_s, warmup_s=WARMUP_S, window_s=WINDOW_S)
    sessions = sessions_for(config, measure_for(config))
    start = time.perf_counter()
    out = simulate(config, sessions)
    wall_s = time.perf_counter() - start
    row = out.row()
    figures = {"num_gpus": num_gpus, "deployment": DEPLOYMENTS[num_gpus], "rate_per_s": rate_per_s,
               "arrivals_s": WARMUP_S + WINDOW_S, "simulated_s": out.result.end_s, "wall_s": wall_s,
               "simulated_s_per_wall_s": out.result.end_s / wall_s, "sessions": len(out.result.sessions),
               "sessions_per_wall_s": len(out.result.sessions) / wall_s, "events": out.result.num_events,
               "events_per_wall_s": out.result.num_events / wall_s, "slo_attainment": row["slo_attainment"],
               "verdict": row["verdict"]}
    print(f"{num_gpus} GPUs at {rate_per_s:.3g}/s: {out.result.end_s:.0f} simulated s in {wall_s:.1f} s "
          f"({figures['simulated_s_per_wall_s']:.0f} x real time; {figures['events_per_wall_s']:.0f} events/s); "
          f"{row['verdict']}", flush=True)
    return figures


def main() -> None:
    (search,) = search_capacities([_config(32, 1.0)], [[]], PointRunner(progress=False))
    capacity = search.capacity_per_s
    print(f"capacity of {SYSTEM} on 32 GPUs: {capacity:.3g} sessions/s")
    runs = [_timed_hour(32, capacity), _timed_hour(256, 8 * capacity)]
    write_result("simulator", {"workload": "gaia", "model": "Llama-3.1-70B", "gpu": "H20", "system": SYSTEM,
                               "capacity_32_gpus_per_s": capacity, "runs": runs,
                               "hour_at_capacity_32_gpus_wall_s": runs[0]["wall_s"]})


if __name__ == "__main__":
    main()
