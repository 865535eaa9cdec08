"""Planner top-3 against simulated top-3: 3 models x 4 workloads on H20, the paper's
cluster sizes (ToolBench and HotpotQA 8 GPUs, DuReader 16, GAIA 32; AMPD.md section 4).

Everything in steady state (AMPD.md section 6): the planner reads the load inside the
measurement window of the run it plans for, and every plan is simulated as a steady-state
run (warm-up, window, drain) on the same sessions.

For each cell the rate is the knee of the planner with AMPD's fixed local share
(``AMPD_LOCAL_SHARE``, the planner before its co-design with the router, so the rates
are those of the earlier results): the highest rate at which the best plan keeps both
P95 latencies within ``KNEE_Z`` x their thresholds (bisection on a log scale); where no
system has a stable plan at the knee (the fixed-share planner's P95 model was optimistic:
Mixtral-8x7B / GAIA), the cell is measured at the first of 0.8, 0.64, ... x the knee where
one has (``rate_per_s``, beside ``knee_rate_per_s``). Each
system is planned as ``ampd.run.planning.plan_for`` plans it (the adaptive systems
co-designed with their router, the others with ``default_local_share``). The planner's
top ``REFINE_TOP_K`` and a seeded sample of ``SAMPLE`` other feasible plans are simulated
and ranked: stable runs first, then by SLO attainment, ties by mean TTFT
(``ampd.run.plan_refine.simulate_plans``); an unstable plan's attainment counts as 0 in
the regret. Two regrets per system: the planner's own best (``attainment_regret``), and
the plan ``[planner] refine_top_k = REFINE_TOP_K`` picks (``refined_regret``): the best
simulated of the planner's top ``REFINE_TOP_K``, asked of ``plan_for`` itself, whose
simulations the shared point cache answers from the pool's runs.

Run: ``python bench/bench_planner_agreement.py [--jobs N]`` (N parallel simulations,
default every core) -> ``bench/results/planner_agreement.json`` and the table printed
in Markdown (docs/PLANNER.md).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from ampd.cli.plan import agreement, simulation_pool  # noqa: E402
from ampd.cli.tables import attainment_text  # noqa: E402
from ampd.run.plan_refine import simulate_plans  # noqa: E402
from ampd.planner import AMPD_LOCAL_SHARE  # noqa: E402
from ampd.run.planning import default_local_share, plan_for  # noqa: E402
from ampd.config import RunConfig, override  # noqa: E402
from ampd.core.errors import InputError  # noqa: E402
from ampd.measure import STABLE  # noqa: E402
from ampd.policy.systems import get_system  # noqa: E402
from ampd.run.runner import PointRunner  # noqa: E402
from ampd.run.sweep import resolve_slo  # noqa: E402

MODELS = ("Llama-3.1-70B", "Qwen3-32B", "Mixtral-8x7B")
CELLS = (("toolbench", 8), ("hotpotqa", 8), ("dureader", 16), ("gaia", 32))
SYSTEMS = ("ampd", "ampd-predictive", "ampd-slo", "pd-disagg")
SAMPLE = 9
KNEE_Z = 1.0
BISECTIONS = 7
REFINE_TOP_K = 5
# [our choice] A cell where no plan of any system is stable at the knee ranks nothing; its
# rate steps down by 0.8 (at most 4 times) until one is, so every cell is compared.
RATE_STEP = 0.8
RATE_STEPS = 5


def _config(model: str, workload: str, num_gpus: int, rate_per_s: float, system: str = "ampd") -> RunConfig:
    return resolve_slo(override(RunConfig(), system=system, cluster={"model": model, "num_gpus": num_gpus},
                                workload={"name": workload, "rate_per_s": rate_per_s}))


def _best_z(config: RunConfig) -> float:
    try:
        return plan_for(config, top_k=1, local_share=AMPD_LOCAL_SHARE)[0].objective
    except InputError:
        return math.inf


def knee_rate(model: str, workload: str, num_gpus: int) -> float:
    """Highest rate (sessions/s) whose best plan has Z <= KNEE_Z, to a factor 2^(1/2^BISECTIONS)."""
    low, high = 0.01, 0.02
    while _best_z(_config(model, workload, num_gpus, high)) <= KNEE_Z:
        low, high = high, 2 * high
    for _ in range(BISECTIONS):
        mid = math.sqrt(low * high)
        low, high = (mid, high) if _best_z(_config(model, workload, num_gpus, mid)) <= KNEE_Z else (low, mid)
    return low


def _carried(row: dict) -> float:
    return row["slo_attainment"] if row["verdict"] == STABLE else 0.0


def cell(model: str, workload: str, num_gpus: int, runner: PointRunner) -> dict:
    """Every system's planned and simulated ranking at the knee of one cell, or
    below it where no system has a stable plan there (module docstring)."""
    knee = rate = knee_rate(model, workload, num_gpus)
    for _ in range(RATE_STEPS):
        out = _at_rate(model, workload, num_gpus, rate, runner)
        if any(s["comparable"] for s in out["systems"].values()):
            break
        rate *= RATE_STEP
    return {**out, "knee_rate_per_s": knee}


def _at_rate(model: str, workload: str, num_gpus: int, rate: float, runner: PointRunner) -> dict:
    """Every system's planned and simulated ranking of one cell at ``rate``."""
    out = {"model": model, "workload": workload, "num_gpus": num_gpus, "rate_per_s": rate, "systems": {}}
    for system in SYSTEMS:
        config = override(_config(model, workload, num_gpus, rate, system), planner={"refine_top_k": REFINE_TOP_K})
        share = default_local_share(system)
        try:
            plans = plan_for(override(config, planner={"refine_top_k": 0}), REFINE_TOP_K)
        except InputError as refusal:
            out["systems"][system] = {"co_designed": get_system(system).adaptive, "refused": str(refusal),
                                      **agreement([])}
            continue
        rows = simulate_plans(config, simulation_pool(config, plans, SAMPLE, share), runner)
        refined = str(plan_for(config, 1, runner=runner)[0].deployment)
        result = {"co_designed": get_system(system).adaptive, "local_share": share, "rows": rows,
                  "planned_local_share": {str(p.deployment): p.prefill.local_share for p in plans},
                  "refined_best": refined, **agreement(rows)}
        if result["comparable"]:
            best = max(_carried(r) for r in rows)
            result["refined_regret"] = best - _carried(next(r for r in rows if r["deployment"] == refined))
        out["systems"][system] = result
    return out


def _rho(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.2f}"


def _rate(c: dict) -> str:
    lowered = c["rate_per_s"] != c["knee_rate_per_s"]
    return f"{c['rate_per_s']:.3g}" + (f" (knee {c['knee_rate_per_s']:.3g})" if lowered else "")


def _markdown(cells: list[dict]) -> str:
    lines = ["| model | workload (GPUs) | rate/s | system | planned top-3 (attain.) | simulated top-3 (attain.) "
             "| same #1 | same top-3 set | same order | Spearman | regret | refined regret |", "|" + "---|" * 12]
    for c in cells:
        for system, s in c["systems"].items():
            if not s["comparable"]:
                why = "the planner refused" if "refused" in s else "no plan stable at this rate"
                lines.append(f"| {c['model']} | {c['workload']} ({c['num_gpus']}) | {_rate(c)} | {system} "
                             f"| {why} | | | | | | | |")
                continue
            attain = {r["deployment"]: attainment_text(r) for r in s["rows"]}
            planned = "; ".join(f"{d} ({attain[d]})" for d in s["planned_top"])
            simulated = "; ".join(f"{d} ({attain[d]})" for d in s["simulated_top"])
            lines.append(f"| {c['model']} | {c['workload']} ({c['num_gpus']}) | {_rate(c)} | {system} "
                         f"| {planned} | {simulated} | {'yes' if s['same_best'] else 'no'} "
                         f"| {'yes' if s['same_top_set'] else 'no'} | {'yes' if s['same_top_order'] else 'no'} "
                         f"| {_rho(s['spearman'])} | {100 * s['attainment_regret']:.1f} pp "
                         f"| {100 * s['refined_regret']:.1f} pp |")
    return "\n".join(lines)


def _summary(cells: list[dict]) -> dict:
    summary = {}
    for system in SYSTEMS:
        runs = [c["systems"][system] for c in cells if c["systems"][system]["comparable"]]
        summary[system] = {key: sum(r[key] for r in runs) for key in ("same_best", "same_top_set", "same_top_order")}
        rhos = [r["spearman"] for r in runs if r["spearman"] is not None and r["spearman"] == r["spearman"]]
        summary[system]["mean_spearman"] = sum(rhos) / len(rhos) if rhos else None
        for key, name in (("attainment_regret", "regret"), ("refined_regret", "refined_regret")):
            regrets = [100 * r[key] for r in runs]
            summary[system][f"mean_{name}_pp"] = sum(regrets) / len(regrets) if runs else None
            summary[system][f"zero_{name}_cells"] = sum(1 for x in regrets if x == 0.0)
        summary[system]["cells"] = len(runs)
        summary[system]["cells_without_a_stable_plan"] = len(cells) - len(runs)
        summary[system]["cells_refused"] = sum("refused" in c["systems"][system] for c in cells)
    return summary


def _write(cells: list[dict], start: float) -> None:
    """The result file with the cells done so far (a run cut short keeps them)."""
    write_result("planner_agreement", {"gpu": "H20", "runs": "steady state", "sample": SAMPLE,
                                       "knee_z": KNEE_Z, "refine_top_k": REFINE_TOP_K, "systems": list(SYSTEMS),
                                       "cells_done": len(cells), "cells_planned": len(MODELS) * len(CELLS),
                                       "summary": _summary(cells), "wall_s": time.perf_counter() - start,
                                       "cells": cells, "markdown": _markdown(cells)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, help="parallel simulations (default: every core)")
    parser.add_argument("--cache", type=Path, help="point cache folder kept between runs (default: a temporary one)")
    args = parser.parse_args()
    start = time.perf_counter()
    cells = []
    with tempfile.TemporaryDirectory() as temporary:
        runner = PointRunner(args.jobs, progress=False, cache_dir=args.cache or Path(temporary))
        for model in MODELS:
            for workload, num_gpus in CELLS:
                cells.append(cell(model, workload, num_gpus, runner))
                _write(cells, start)
                print(f"{model} {workload} ({num_gpus} GPUs) at {cells[-1]['rate_per_s']:.3g}/s: "
                      + ", ".join(f"{k}: rho {_rho(v['spearman'])}, regret {v['attainment_regret']}, refined "
                                  f"{v.get('refined_regret')}" for k, v in cells[-1]["systems"].items()), flush=True)
    print(_markdown(cells))
    print(_summary(cells))


if __name__ == "__main__":
    main()
