"""Served vs simulated, both in steady state (AMPD.md section 6): ToolBench-like
sessions (Llama-3.1-70B on 8 x H20, ``P:<TP=2,DP=2> D:<TP=2,DP=2>``, 0.6 sessions/s,
three quarters of its capacity for ``ampd-predictive``, 0.81/s) replayed through two coordinator replicas sharing a real Redis
over four mock engines, against ``ampd simulate`` of the same configuration: the same
sessions and arrivals, measured over the same window (36 s warm-up, 1,800 s window:
about 1,100 sessions, enough for a verdict). SLO attainment and verdict on both sides, local-prefill share,
mean TTFT, and the share of the window's rounds placed (local or remote) as the
simulator placed them; for ``ampd-predictive`` and ``ampd-slo``, whose served
routers read the decode batches the replicas report (``ampd.serve.rounds.decode_batch``). The figures docs/SERVING.md quotes; tests/test_serve_cluster.py
asserts the tolerances on a shorter window.

Run: ``python bench/bench_serve_parity.py`` -> ``bench/results/serve_parity.json``.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from ampd.config import RunConfig  # noqa: E402
from ampd.run.resolve import sessions_for  # noqa: E402
from ampd.run.simulate import simulate  # noqa: E402
from ampd.measure import measure_window  # noqa: E402
from ampd.metrics.summary import same_placement_share  # noqa: E402
from ampd.core.clock import ScaledClock  # noqa: E402
from ampd.cluster.replay import replay_across  # noqa: E402
from ampd.cluster.up import LocalCluster, free_serve_ports  # noqa: E402

TIME_SCALE = 0.25
REPLICAS = 2
RATE_PER_S = 0.6
MEASURE = {"warmup_s": 36.0, "window_s": 1800.0, "drain_s": 300.0}
SYSTEMS = ("ampd-predictive", "ampd-slo")  # one after the other, in one run


def _config(system: str) -> RunConfig:
    return RunConfig(system=system,
                     cluster={"model": "Llama-3.1-70B", "gpu": "H20", "num_gpus": 8,
                              "deployment": "P:<TP=2,DP=2> D:<TP=2,DP=2>"},
                     workload={"name": "toolbench", "rate_per_s": RATE_PER_S}, measure=MEASURE,
                     serve={**free_serve_ports(), "time_scale": TIME_SCALE})


def _parity(system: str) -> dict:
    """One system served and simulated; its figures."""
    config = _config(system)
    sim = simulate(config)
    sessions = sessions_for(config, sim.plan)
    with tempfile.TemporaryDirectory() as logs, LocalCluster(config, logs, coordinators=REPLICAS) as cluster:
        results = asyncio.run(replay_across(cluster.urls, sessions, model=config.cluster.model,
                                            clock=ScaledClock(TIME_SCALE), ttft_slo_s=sim.slo.ttft_s,
                                            itl_slo_s=sim.slo.itl_s, timeout_s=60, plan=sim.plan))
    records = [r for result in results for r in result.sessions]
    served, stability = measure_window(records, sim.plan, sim.slo.ttft_s, sim.slo.itl_s, config.slo.scope)
    start, end = sim.plan.warmup_s, sim.plan.warmup_s + sim.plan.window_s
    figures = {"served_attainment": served.slo_attainment, "simulated_attainment": sim.summary.slo_attainment,
               "served_attainment_first_half": stability.attainment_half,
               "simulated_attainment_first_half": sim.stability.attainment_half,
               "served_local_share": served.local_prefill_share,
               "simulated_local_share": sim.summary.local_prefill_share,
               "served_ttft_mean_s": served.ttft_mean_s, "simulated_ttft_mean_s": sim.summary.ttft_mean_s,
               "rounds_placed_alike": same_placement_share(
                   [r for r in sim.result.sessions if start <= r.arrival_s < end],
                   [r for r in records if start <= r.arrival_s < end]),
               "failed_sessions": sum(len(r.failed) for r in results)}
    print(system)
    for k, v in figures.items():
        print(f"  {k}: {v:.3f}")
    print(f"  served: {stability.verdict} {stability.reason}; simulated: {sim.stability.verdict} "
          f"{sim.stability.reason}")
    return {"measured_sessions": served.num_sessions, "served_verdict": stability.verdict,
            "simulated_verdict": sim.stability.verdict, **figures}


def main() -> None:
    write_result("serve_parity", {"deployment": _config(SYSTEMS[0]).cluster.deployment, "rate_per_s": RATE_PER_S,
                                  **MEASURE, "replicas": REPLICAS, "time_scale": TIME_SCALE,
                                  "systems": {system: _parity(system) for system in SYSTEMS}})


if __name__ == "__main__":
    main()
