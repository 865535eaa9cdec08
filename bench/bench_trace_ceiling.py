"""The demo's Mooncake numbers that the README quotes: prompt lengths of its 300
sessions, and the share of them that cannot meet the derived TTFT threshold even
on an idle 2-GPU H20 prefill replica (the attainment ceiling at any load).

Run: ``python bench/bench_trace_ceiling.py`` -> ``bench/results/trace_ceiling.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from ampd.config import load_config, override  # noqa: E402
from ampd.run.resolve import perf_model_for, sample_sessions, slo_for  # noqa: E402

DEMO = Path(__file__).resolve().parent.parent / "configs" / "demo.toml"
PREFILL_TP = 2  # the demo's prefill replicas: P:<TP=2,DP=2>


def main() -> None:
    base, sweep = load_config(DEMO)
    mooncake = next(w for w in sweep.workloads if w.workload.startswith("builtin:mooncake"))
    config = override(base, workload={"name": None, "trace": mooncake.workload,
                                      "rate_per_s": min(mooncake.rates_per_s)})
    perf, sessions = perf_model_for(config), sample_sessions(config)
    slo = slo_for(config, perf)
    prompts = np.array([s.rounds[0].input_tokens for s in sessions])
    idle_ttft_s = [np.mean([perf.prefill_s(s.history_tokens(i), r.input_tokens, PREFILL_TP)
                            for i, r in enumerate(s.rounds)]) for s in sessions]
    unreachable = float(np.mean([t > slo.ttft_s for t in idle_ttft_s]))
    figures = {"num_sessions": len(sessions), "ttft_slo_s": slo.ttft_s,
               "first_prompt_tokens_mean": float(prompts.mean()),
               "first_prompt_tokens_p99": float(np.percentile(prompts, 99)),
               "first_prompt_tokens_max": int(prompts.max()),
               "share_unreachable_on_idle_tp2": unreachable}
    print(figures)
    write_result("trace_ceiling", figures)


if __name__ == "__main__":
    main()
