"""Simulator speed: sessions and events per wall-clock second on the GAIA-like
workload (11.3 rounds, 6161-token prompts) over 32 simulated H20 GPUs.

Run: ``python bench/bench_simulator.py`` -> ``bench/results/simulator.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from ampd.config import RunConfig, override  # noqa: E402
from ampd.experiment import sessions_for, simulate  # noqa: E402
from ampd.sweep import resolve_slo  # noqa: E402

DEPLOYMENT = "P:<TP=4,DP=4> D:<TP=8,DP=2>"
NUM_SESSIONS = 400
RATE_PER_S = 0.1


def main() -> None:
    base = override(RunConfig(), cluster={"num_gpus": 32, "deployment": DEPLOYMENT},
                    workload={"name": "gaia", "num_sessions": NUM_SESSIONS, "rate_per_s": RATE_PER_S})
    runs = {}
    for system in ("ampd", "pd-disagg"):
        config = resolve_slo(override(base, system=system))
        sessions = sessions_for(config)
        start = time.perf_counter()
        out = simulate(config, sessions)
        wall_s = time.perf_counter() - start
        runs[system] = {
            "wall_s": wall_s, "num_sessions": len(sessions), "num_events": out.result.num_events,
            "num_rounds": out.summary.num_rounds, "virtual_s": out.result.end_s,
            "sessions_per_wall_s": len(sessions) / wall_s, "events_per_wall_s": out.result.num_events / wall_s,
            "slo_attainment": out.summary.slo_attainment,
        }
        print(f"{system}: {len(sessions)} sessions, {out.result.num_events} events in {wall_s:.2f} s "
              f"({len(sessions) / wall_s:.0f} sessions/s, {out.result.num_events / wall_s:.0f} events/s)")
    write_result("simulator", {"workload": "gaia", "model": base.cluster.model, "gpu": base.cluster.gpu,
                               "num_gpus": 32, "deployment": DEPLOYMENT, "rate_per_s": RATE_PER_S, "runs": runs})


if __name__ == "__main__":
    main()
