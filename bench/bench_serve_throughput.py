"""Sustained sessions per second of one coordinator on this machine: a 16-worker
mock cluster (``P:<TP=1,DP=8> D:<TP=1,DP=8>``, Llama-3.1-8B on H100 timings, time
scale 0.05 so the emulated GPUs are never the bottleneck), the shared state in a
real Redis server, and the load generator, all on the same cores. Sessions of 3
rounds (256 new tokens, 16 output tokens, 0.2 s tool calls) arrive open loop at
increasing rates; a rate is sustained when every session completes and the
median TTFT stays within 2x its value at the lowest rate. Also the coordinator's CPU
time per round at each rate (its process's user + system time, ``psutil``).

Run: ``python bench/bench_serve_throughput.py [--baseline-src DIR]`` ->
``bench/results/serve_throughput.json`` (``common.with_baseline``: another checkout
measured first, in the same run).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil  # noqa: E402
from common import with_baseline, write_result  # noqa: E402

from ampd.config import RunConfig  # noqa: E402
from ampd.core.session import Round, Session  # noqa: E402
from ampd.core.clock import ScaledClock  # noqa: E402
from ampd.cluster.replay import replay_sync  # noqa: E402
from ampd.cluster.up import LocalCluster, free_serve_ports  # noqa: E402

TIME_SCALE = 0.05
RATES_PER_WALL_S = (5, 10, 20, 40, 80)
WALL_S_PER_RATE = 10.0
ROUNDS = (Round(256, 16, 0.2), Round(256, 16, 0.2), Round(256, 16, 0.0))


def _sessions(rate_per_wall_s: float) -> list[Session]:
    """Evenly spaced arrivals (model seconds) for ``WALL_S_PER_RATE`` wall seconds."""
    count = int(rate_per_wall_s * WALL_S_PER_RATE)
    gap_s = 1.0 / (rate_per_wall_s * TIME_SCALE)
    return [Session(f"r{rate_per_wall_s}-{i}", i * gap_s, ROUNDS)
            for i in range(count)]


def measure() -> dict:
    """Every rate's figures (module docstring) for this checkout's coordinator."""
    config = RunConfig(system="ampd-predictive",
                       cluster={"model": "Llama-3.1-8B", "gpu": "H100-SXM", "num_gpus": 16,
                                "deployment": "P:<TP=1,DP=8> D:<TP=1,DP=8>"},
                       workload={"name": "toolbench", "num_sessions": 5},
                       serve={**free_serve_ports(),
                              "time_scale": TIME_SCALE})
    rows = []
    with tempfile.TemporaryDirectory() as logs, LocalCluster(config, Path(logs)) as cluster:
        coordinator = psutil.Process(cluster.child("coordinator-0").process.pid)
        for rate in RATES_PER_WALL_S:
            cpu = coordinator.cpu_times()
            result = replay_sync(cluster.urls[0], _sessions(rate), model=config.cluster.model,
                                 clock=ScaledClock(TIME_SCALE), ttft_slo_s=1.0, itl_slo_s=1.0, timeout_s=60)
            after = coordinator.cpu_times()
            s = result.summary
            rows.append({"offered_sessions_per_s": rate, "sessions": s.num_sessions, "complete": s.num_complete,
                         "failed": len(result.failed), "wall_s": result.wall_s,
                         "completed_sessions_per_s": s.num_complete / result.wall_s,
                         "rounds_per_s": s.num_rounds / result.wall_s,
                         "ttft_p50_ms_wall": 1e3 * s.ttft_p50_s * TIME_SCALE,
                         "itl_p50_ms_wall": 1e3 * s.itl_p50_s * TIME_SCALE,
                         "coordinator_cpu_ms_per_round": 1e3 * (after.user + after.system - cpu.user - cpu.system)
                         / max(1, s.num_rounds)})
            print(rows[-1], file=sys.stderr, flush=True)
    base_ttft = rows[0]["ttft_p50_ms_wall"]
    sustained = [r["offered_sessions_per_s"] for r in rows
                 if r["failed"] == 0 and r["complete"] == r["sessions"] and r["ttft_p50_ms_wall"] <= 2 * base_ttft]
    return {"deployment": config.cluster.deployment, "time_scale": TIME_SCALE, "rounds_per_session": len(ROUNDS),
            "rows": rows, "sustained_sessions_per_s": max(sustained, default=0)}


def main() -> None:
    write_result("serve_throughput", with_baseline(__doc__, measure))


if __name__ == "__main__":
    main()
