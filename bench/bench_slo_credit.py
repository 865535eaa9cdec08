"""What ``ampd-slo``'s slack credit (``policy.slo_slack_horizon_tokens``) buys and costs,
side by side in one run, in steady state (issue 12; docs/SIMULATOR.md, "SLO routing").

The credit lets a local prefill spend ITL slack that the decode batch has not earned
yet: what its next 32 tokens would earn at the current step time. The forecast
assumes the step stays as it is. Two cells of the reproduction grid (Mixtral-8x7B /
HotpotQA, 8 x H20), on two deployments:

- ``prefill-bound``, ``P:<TP=4,DP=1> D:<TP=4,DP=1>``: the deployment of the
  development runs that set the credit (docs/SIMULATOR.md): one prefill replica, so
  remote prefills queue and local ones are what keeps TTFT;
- ``decode-bound``, ``P:<TP=2,DP=3> D:<TP=2,DP=1>``: ``pd-disagg``'s deployment in
  ``bench/results/planner_capacity.json`` (capacity 4.30 there): one decode replica whose
  step nears the ITL threshold as the batch grows, so a forecast at today's step
  overstates tomorrow's slack.

Per deployment: ``pd-disagg`` (never local) and ``ampd-slo`` with the credit (32
tokens, the default) and without (0), each at the deployment's rates (attainment,
verdict, P95 TTFT and ITL, local share), and each one's capacity (sessions/s at
>= 90 % steady-state attainment).

Rates: around the development runs' 3.09 sessions/s (docs/SIMULATOR.md) and around
``pd-disagg``'s 4.30 [our choice: one below, one at, one above each].

Run: ``python bench/bench_slo_credit.py`` (under a minute of simulation here) ->
``bench/results/slo_credit.json``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from ampd.run.capacity_search import search_capacities  # noqa: E402
from ampd.config import RunConfig, override  # noqa: E402
from ampd.run.runner import PointRunner  # noqa: E402
from ampd.run.sweep import capacity_row, resolve_slo  # noqa: E402

MODEL, GPU, WORKLOAD, NUM_GPUS = "Mixtral-8x7B", "H20", "hotpotqa", 8
DEPLOYMENTS = {"prefill-bound": ("P:<TP=4,DP=1> D:<TP=4,DP=1>", (2.7, 3.09, 3.4)),
               "decode-bound": ("P:<TP=2,DP=3> D:<TP=2,DP=1>", (3.8, 4.2, 4.6))}
VARIANTS = {"pd-disagg": ("pd-disagg", {}),
            "ampd-slo": ("ampd-slo", {}),
            "ampd-slo, no credit": ("ampd-slo", {"slo_slack_horizon_tokens": 0})}
POINT_KEYS = ("rate_per_s", "slo_attainment", "verdict", "ttft_p95_s", "itl_p95_s", "local_prefill_share")


def _base(deployment: str, rate_per_s: float) -> RunConfig:
    return resolve_slo(override(RunConfig(), cluster={"model": MODEL, "gpu": GPU, "num_gpus": NUM_GPUS,
                                                      "deployment": deployment},
                                workload={"name": WORKLOAD, "rate_per_s": rate_per_s}))


def main() -> None:
    start = time.perf_counter()
    run = PointRunner(jobs=1, progress=False)
    results = {}
    for name, (deployment, rates) in DEPLOYMENTS.items():
        base = _base(deployment, rates[0])
        bases = {v: override(base, system=system, **({"policy": policy} if policy else {}))
                 for v, (system, policy) in VARIANTS.items()}
        keys = [(v, r) for v in VARIANTS for r in rates]
        rows = run([override(bases[v], workload={"rate_per_s": r}) for v, r in keys])
        seeds = [[row for (v, _), row in zip(keys, rows) if v == variant] for variant in VARIANTS]
        searches = search_capacities(list(bases.values()), seeds, run)
        variants = {}
        for variant, search in zip(VARIANTS, searches):
            cap = capacity_row(bases[variant], search)
            points = [{k: row[k] for k in POINT_KEYS} for (v, _), row in zip(keys, rows) if v == variant]
            variants[variant] = {"points": points, "capacity_per_s": cap["capacity_per_s"],
                                 "capacity_above_per_s": cap["above_per_s"]}
            print(f"{name} {variant}: " + ", ".join(f"{p['rate_per_s']}: {100 * p['slo_attainment']:.1f}% "
                                                   f"({p['verdict']}, local {100 * p['local_prefill_share']:.1f}%)"
                                                   for p in points)
                  + f"; capacity {cap['capacity_per_s']:.3g}/s", flush=True)
        results[name] = {"deployment": deployment, "ttft_slo_s": base.slo.ttft_s, "itl_slo_s": base.slo.itl_s,
                         "scope": base.slo.scope.value, "rates_per_s": list(rates), "variants": variants}
    write_result("slo_credit", {"model": MODEL, "gpu": GPU, "workload": WORKLOAD, "num_gpus": NUM_GPUS,
                                "variants": {v: {"system": s, "policy": p} for v, (s, p) in VARIANTS.items()},
                                "deployments": results, "wall_s": time.perf_counter() - start})


if __name__ == "__main__":
    main()
