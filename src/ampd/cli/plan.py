"""``ampd plan``: AMPD's offline planner from the command line (AMPD.md section 2;
docs/PLANNER.md). Prints the top-k plans in the paper's notation; ``--simulate`` runs
them and a seeded sample of other feasible plans through the simulator and sets the
planned rank against the simulated one."""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence

from rich.table import Table

from ampd.cli.options import add_run_options, config_from_args, non_negative_int, output_dir, positive_int
from ampd.cli.tables import attainment_text, print_table
from ampd.config import RunConfig, override
from ampd.core.errors import InputError
from ampd.run.resolve import batching_for, rate_for
from ampd.measure import STABLE
from ampd.metrics.report import write_json
from ampd.run.plan_refine import simulate_plans
from ampd.planner import AMPD_LOCAL_SHARE, SOLVERS, Plan, enumerate_plans, estimate_tau
from ampd.run.planning import default_local_share, plan_for, planner_inputs
from ampd.policy.systems import get_system
from ampd.run.runner import PointRunner
from ampd.run.sweep import resolve_slo, workload_source

PLANNED_SYSTEM = "ampd-slo"
"""[our choice] The system ``ampd plan`` plans for when neither ``--system`` nor the
configuration names one: the planner's router model describes the predictive routers
(``ampd-slo``, ``ampd-predictive``), not the paper's windowed ``ampd``, whose herding can
make the plan it finds unstable (docs/PLANNER.md, "Why the fixed-share planner's pick lost", 4); and
``ampd-slo`` leads the grid (docs/RESULTS.md)."""


def simulation_pool(config: RunConfig, plans: Sequence[Plan], sample: int, local_share: float) -> list[Plan]:
    """``plans`` plus ``sample`` other feasible plans drawn with ``random.Random(config.seed)``,
    all in the planner's order (``Plan.order_key``)."""
    c = config.cluster
    sessions, perf, slo, window_s = planner_inputs(config)
    table = estimate_tau(sessions, perf, slo, c.num_gpus, c.gpus_per_server, local_share, config.slo.scope.value,
                         window_s=window_s, batching=batching_for(config, perf),
                         mixed_degrees=config.planner.mixed_degrees)
    chosen = {str(p.deployment) for p in plans}
    others = [p for p in enumerate_plans(table) if str(p.deployment) not in chosen]
    extra = random.Random(config.seed).sample(others, min(sample, len(others)))
    return sorted(list(plans) + extra, key=lambda p: p.order_key)


def _carried(row: dict) -> float:
    """A plan's steady-state attainment at the rate, 0 when its run was not stable (it
    does not carry the rate, or nothing says it does)."""
    return row["slo_attainment"] if row["verdict"] == STABLE else 0.0


def agreement(rows: Sequence[dict], top: int = 3) -> dict:
    """How the planned ranking of simulated ``rows`` agrees with the simulated one: the
    same best plan, the same top-``top`` set, the same top-``top`` order, Spearman's rho
    over all rows, and the attainment the planner's best gives up against the best
    (a run that is not stable counts as 0: ``_carried``). ``comparable`` is False, and
    the comparisons None, when no plan's run is stable: nothing ranks them then.

    Raises:
        ValueError: no rows.
    """
    if not any(r["verdict"] == STABLE for r in rows):
        return {"comparable": False, "same_best": None, "same_top_set": None, "same_top_order": None,
                "spearman": None, "attainment_regret": None, "planned_top": [], "simulated_top": []}
    planned = [r["deployment"] for r in sorted(rows, key=lambda r: r["planned_rank"])]
    simulated = [r["deployment"] for r in sorted(rows, key=lambda r: r["simulated_rank"])]
    best = max(_carried(r) for r in rows)
    first = next(r for r in rows if r["planned_rank"] == 1)
    from scipy.stats import spearmanr  # here, not at the top: only --simulate needs scipy.stats (~0.8 s)

    rho = spearmanr([r["planned_rank"] for r in rows], [r["simulated_rank"] for r in rows]).statistic
    return {"comparable": True, "same_best": planned[0] == simulated[0],
            "same_top_set": set(planned[:top]) == set(simulated[:top]),
            "same_top_order": planned[:top] == simulated[:top], "spearman": float(rho) if len(rows) > 2 else None,
            "attainment_regret": best - _carried(first), "planned_top": planned[:top],
            "simulated_top": simulated[:top]}


def plan_config(args: argparse.Namespace) -> RunConfig:
    """The run configuration `ampd plan` plans for, from its parsed arguments.

    Raises:
        InputError: --deployment given; a colocated system; as the configuration's own checks.
    """
    config, _ = config_from_args(args)
    workload = {"rate_per_s": args.rate} if args.rate is not None else {}
    if args.trace:
        workload.update(name=None, trace=args.trace)
    elif args.workload:
        workload.update(workload_source(args.workload))
    if args.deployment is not None:
        raise InputError(f"ampd plan chooses the deployment; --deployment {args.deployment!r} is for ampd simulate "
                         "and ampd sweep (ampd plan --simulate runs the plans it finds)")
    from_file = args.system is None and "system" in config.model_fields_set
    system = config.system if from_file else PLANNED_SYSTEM if args.system is None else args.system
    if get_system(system).colocated:
        raise InputError(f"{f'{args.config}: system: ' if from_file else ''}system {system!r} runs colocated replicas, which ampd plan does not plan (it splits "
                         "GPUs between prefill and decode replicas); plan for a disaggregated system, e.g. --system "
                         "ampd-slo")
    planner = {} if args.mixed_degrees is None else {"mixed_degrees": args.mixed_degrees}
    return resolve_slo(override(config, system=system, workload=workload, planner=planner))


def _plans_table(title: str, plans: Sequence[Plan]) -> Table:
    table = Table(title=title)
    for name in ("rank", "plan", "Z", "TTFT P95 (s)", "tau_pre", "ITL P95 (ms)", "tau_dec", "GPUs", "status"):
        table.add_column(name, justify="left" if name in ("plan", "status") else "right")
    for rank, p in enumerate(plans, 1):
        table.add_row(str(rank), str(p.deployment), f"{p.objective:.3f}", f"{p.prefill.p95_s:.3f}",
                      f"{p.prefill.tau:.3f}", f"{1000 * p.decode.p95_s:.1f}", f"{p.decode.tau:.3f}",
                      str(p.num_gpus), p.status)
    return table


def _ranks_table(title: str, rows: Sequence[dict]) -> Table:
    table = Table(title=title)
    for name in ("plan", "Z", "planned rank", "simulated rank", "SLO attain.", "TTFT mean (s)", "local prefill"):
        table.add_column(name, justify="left" if name == "plan" else "right")
    for r in rows:
        shown = r["verdict"] == STABLE
        table.add_row(r["deployment"], f"{r['objective']:.3f}", str(r["planned_rank"]),
                      str(r["simulated_rank"]) if shown else f"{r['simulated_rank']} (tied)", attainment_text(r),
                      f"{r['ttft_mean_s']:.3f}" if shown else "-",
                      f"{100 * r['local_prefill_share']:.1f}%" if shown else "-")
    return table


def _agreement_line(a: dict, top: int) -> str:
    if not a["comparable"]:
        return "planned vs simulated: no plan's run is stable at this rate, so nothing ranks them"

    def yes(flag: bool) -> str:
        return "yes" if flag else "no"
    rho = "-" if a["spearman"] is None else f"{a['spearman']:.2f}"
    return (f"planned vs simulated: same best {yes(a['same_best'])}, same top-{top} set {yes(a['same_top_set'])}, "
            f"same top-{top} order {yes(a['same_top_order'])}, Spearman {rho}, the planned best gives up "
            f"{100 * a['attainment_regret']:.1f} points of attainment")


def cmd_plan(args: argparse.Namespace) -> None:
    """Handler of ``ampd plan``: plan, print, optionally simulate, write ``plans.json``."""
    out_dir = output_dir(args, "out/plan")
    config = plan_config(args)
    share = default_local_share(config.system) if args.local_share is None else args.local_share
    co_designed = args.local_share is None and get_system(config.system).adaptive
    runner = PointRunner(args.jobs, progress=False)
    start = time.perf_counter()
    plans = plan_for(config, args.top_k, args.local_share, args.solver, runner)
    planning_s = time.perf_counter() - start
    c, w = config.cluster, config.workload
    routing = "co-designed with the router" if co_designed else f"local share {share:g}"
    print_table(_plans_table(f"{c.model} on {c.num_gpus} x {c.gpu}, {w.label} at {rate_for(config):g} sessions/s "
                             f"({w.arrival_process} arrivals), "
                             f"SLO TTFT {config.slo.ttft_s:.2f} s, ITL {1000 * config.slo.itl_s:.0f} ms; "
                             f"planned for {config.system}, {routing}; {args.solver}, {planning_s:.2f} s", plans))
    if config.planner.refine_top_k and config.planner.refine_by == "capacity":
        print(f"[planner] refine_by = capacity: the top {config.planner.refine_top_k} were drawn at the planner's "
              "knee (their Z is there) and are in the order of their simulated capacity")
    result = {"config": config.model_dump(mode="json"), "local_share": None if co_designed else share,
              "solver": args.solver, "planning_s": planning_s, "plans": [p.to_dict() for p in plans]}
    if args.simulate:
        rows = simulate_plans(config, simulation_pool(config, plans, args.sample, share), runner)
        print_table(_ranks_table(f"planned vs simulated rank ({config.system}, "
                                 f"{config.slo.scope.value} scope)", rows))
        result["simulated"], result["agreement"] = rows, agreement(rows, len(plans))
        print(_agreement_line(result["agreement"], len(plans)))
    out = out_dir / "plans.json"
    write_json(out, result)
    print(f"plans in {out}")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``plan`` subcommand to the ``ampd`` parser's ``subparsers``."""
    p = subparsers.add_parser("plan", help="plan prefill/decode replicas and TP degrees on N GPUs (AMPD's planner)")
    add_run_options(p)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--workload", help="toolbench|gaia|hotpotqa|dureader, builtin:<trace>, or a trace file")
    source.add_argument("--trace", help="a trace file or builtin:<trace> (same as --workload with a trace)")
    p.add_argument("--rate", type=float, help="session arrival rate to plan for (sessions/s)")
    p.add_argument("--system", help="the system planned for and simulated (default: the configuration's system, "
                                     f"else {PLANNED_SYSTEM})")
    p.add_argument("--top-k", type=positive_int, default=3, help="plans to print (default: 3)")
    p.add_argument("--local-share", type=float,
                   help="a fixed share of prefills run locally (default: co-designed with the router for AMPD's "
                        f"adaptive systems, 0 for the others; {AMPD_LOCAL_SHARE} was the planner's fixed AMPD share)")
    p.add_argument("--solver", choices=SOLVERS, default="scip", help="ILP solver (default: scip)")
    p.add_argument("--mixed-degrees", action=argparse.BooleanOptionalAction,
                   help="also plan decode and prefill sides of two TP degrees (default: the configuration's [planner] "
                        "mixed_degrees, off)")
    p.add_argument("--simulate", action="store_true", help="simulate the top-k and a sample of other plans")
    p.add_argument("--sample", type=non_negative_int, default=5, help="other feasible plans --simulate runs (default: 5)")
    p.add_argument("--jobs", type=positive_int, help="parallel simulations (default: every core)")
    p.set_defaults(func=cmd_plan)
