"""Is the verdict's growth check (``ampd.measure.verdict``: sessions in the system
up more than 20 % between the window's first and last quarter) seeing overload,
or a population still filling after the warm-up? The cell where the planner
looked wrong in ``planner_agreement.json``: Mixtral-8x7B / GAIA on 32 H20 at 0.975
sessions/s, ``ampd-predictive``, the ILP's pick (judged unstable) and a plan judged
stable, three seeds each.

Per run: attainment over the window and its first half, the growth the verdict
measured, and the growth an infinite-server system would show on the same arrival
times with the run's own session lifetimes (``reference_growth``: at each arrival
time t, the sum over earlier arrivals a of P(L > t - a), L the measured lifetimes;
no queue grows in it, so what it shows is the population still filling after the
warm-up and the arrivals' own ups and downs); ``excess_growth`` is the difference. Plus the mean measured lifetime
against the unloaded lifetime the warm-up (2 of them) was sized by, and per quarter of
the window (by arrival) the sessions, their mean rounds and mean lifetime: an
overloaded cluster's lifetimes grow quarter by quarter, whatever the sessions hold.

Run: ``python bench/bench_backlog_growth.py`` (~2 min) -> ``bench/results/backlog_growth.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from ampd.config import RunConfig, override  # noqa: E402
from ampd.experiment import simulate  # noqa: E402
from ampd.measure.verdict import backlog_growth  # noqa: E402
from ampd.measure.window import in_system_at_arrivals  # noqa: E402
from ampd.sweep import resolve_slo  # noqa: E402

MODEL, WORKLOAD, NUM_GPUS, RATE_PER_S, SYSTEM = "Mixtral-8x7B", "gaia", 32, 0.975, "ampd-predictive"
DEPLOYMENTS = ("P:<TP=4,DP=1> D:<TP=4,DP=7>",   # the ILP's pick, judged unstable
               "P:<TP=4,DP=1> D:<TP=2,DP=14>")  # judged stable at seed 0
SEEDS = (0, 1, 2)


def reference_growth(records, start_s: float, end_s: float) -> float:
    """The verdict's growth measure on an infinite-server system fed the run's own
    arrivals, each session living a lifetime drawn from the run's (module
    docstring): at an arrival time t, the expected count is the sum over earlier
    arrivals a of P(L > t - a), L the measured lifetimes."""
    lifetimes_s = np.sort([r.done_s - r.arrival_s for r in records if r.done_s is not None])
    arrivals_s = np.array([t for t, _ in in_system_at_arrivals(records)])
    samples = []
    for i, t in enumerate(arrivals_s):
        ages_s = t - arrivals_s[:i + 1]
        alive = 1.0 - np.searchsorted(lifetimes_s, ages_s, side="right") / len(lifetimes_s)
        samples.append((float(t), float(alive.sum())))
    return float(backlog_growth(samples, start_s, end_s)[0])


def run(deployment: str, seed: int) -> dict:
    config = resolve_slo(override(RunConfig(), system=SYSTEM, seed=seed,
                                  cluster={"model": MODEL, "num_gpus": NUM_GPUS, "deployment": deployment},
                                  workload={"name": WORKLOAD, "rate_per_s": RATE_PER_S, "seed": seed}))
    out = simulate(config)
    plan, records = out.plan, out.result.sessions
    start_s, end_s = plan.warmup_s, plan.warmup_s + plan.window_s
    reference = reference_growth(records, start_s, end_s)
    lifetimes_s = [r.done_s - r.arrival_s for r in records if r.done_s is not None and start_s <= r.arrival_s < end_s]
    quarter_s = (end_s - start_s) / 4
    quarters = [[r for r in records if start_s + k * quarter_s <= r.arrival_s < start_s + (k + 1) * quarter_s]
                for k in range(4)]
    return {"deployment": deployment, "seed": seed, "verdict": out.stability.verdict,
            "slo_attainment": out.summary.slo_attainment, "attainment_half": out.stability.attainment_half,
            "growth": out.stability.backlog_growth, "reference_growth": reference,
            "excess_growth": out.stability.backlog_growth - reference,
            "mean_lifetime_s": float(np.mean(lifetimes_s)), "unloaded_lifetime_s": plan.lifetime_s,
            "warmup_s": plan.warmup_s, "window_s": plan.window_s,
            "by_arrival_quarter": [{"sessions": len(q), "mean_rounds": float(np.mean([len(r.rounds) for r in q])),
                                    "mean_lifetime_s": float(np.mean([r.done_s - r.arrival_s for r in q
                                                                      if r.done_s is not None]))}
                                   for q in quarters]}


def main() -> None:
    runs = [run(d, s) for d in DEPLOYMENTS for s in SEEDS]
    for r in runs:
        print({k: round(float(v), 3) if isinstance(v, float) else v for k, v in r.items()}, flush=True)
    write_result("backlog_growth", {"model": MODEL, "workload": WORKLOAD, "num_gpus": NUM_GPUS,
                                    "rate_per_s": RATE_PER_S, "system": SYSTEM, "runs": runs})


if __name__ == "__main__":
    main()
