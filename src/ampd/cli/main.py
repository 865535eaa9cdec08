"""The ``ampd`` command: ``simulate`` one system at one rate, ``sweep`` systems x
workloads x rates."""

from __future__ import annotations

import argparse
import math
import sys

from ampd.cli import plan, profile, replay, reproduce, serve, validate
from ampd.cli.options import add_run_options, config_from_args, output_dir, positive_int
from ampd.cli.tables import arrivals_text, capacity_table, print_table, summary_table
from ampd.config import DEFAULT_SWEEP_SYSTEMS, RunConfig, SweepConfig, SweepWorkload, override
from ampd.core.errors import AmpdError, InputError
from ampd.run.simulate import simulate
from ampd.measure import STABLE, TRANSIENT
from ampd.metrics.report import decision_rows, round_rows, write_csv, write_json, write_jsonl
from ampd.policy.systems import SYSTEMS
from ampd.run.runner import PointRunner
from ampd.run.sweep import plan_sweep, resolve, resolve_measure, sweep_capacities, workload_source


def _floats(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"rates must be finite positive numbers, got {text!r}")
    return values


def _names(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def cmd_simulate(args: argparse.Namespace) -> None:
    config, _ = config_from_args(args)
    out_dir = output_dir(args, "out/simulate")
    changes = {"system": args.system} if args.system is not None else {}
    workload = {"rate_per_s": args.rate} if args.rate is not None else {}
    if args.workload is not None:
        workload.update(workload_source(args.workload))
    config = resolve(override(config, **changes, workload=workload))
    out = simulate(config)
    row = out.row()
    print_table(summary_table(f"{config.cluster.model} on {config.cluster.num_gpus} x {config.cluster.gpu}, "
                              f"{config.cluster.deployment}; SLO TTFT {out.slo.ttft_s:.2f} s, "
                              f"ITL {1000 * out.slo.itl_s:.0f} ms ({config.slo.scope.value} scope); "
                              f"{arrivals_text(row)}", [row]))
    print(measurement_note(row))
    write_json(out_dir / "config.json", config.model_dump(mode="json"))
    write_json(out_dir / "summary.json", row)
    write_csv(out_dir / "rounds.csv", round_rows(out.result.sessions))
    write_jsonl(out_dir / "decisions.jsonl", decision_rows(out.result.binds + out.result.routes))
    print(f"results in {out_dir}/ (summary.json, rounds.csv, decisions.jsonl, config.json)")


def _sweep_from_args(args: argparse.Namespace, base: RunConfig, sweep: SweepConfig | None) -> SweepConfig:
    """The file's [sweep] table with --systems, --workloads and --rates applied."""
    systems = args.systems or (sweep.systems if sweep else list(DEFAULT_SWEEP_SYSTEMS))
    if args.rates and not args.workloads and sweep is not None:
        workloads = [w.model_copy(update={"rates_per_s": args.rates}) for w in sweep.workloads]
    elif args.workloads or args.rates or sweep is None:
        if not args.rates:
            raise InputError("sweep: give --rates (or a [sweep] table in --config)")
        names = args.workloads or [base.workload.label]
        workloads = [SweepWorkload(workload=n, rates_per_s=args.rates) for n in names]
    else:
        workloads = sweep.workloads
    capacity = args.capacity if args.capacity is not None else bool(sweep and sweep.capacity)
    return SweepConfig(systems=systems, workloads=workloads, deployments=sweep.deployments if sweep else {},
                       capacity=capacity, capacity_attainment=sweep.capacity_attainment if sweep else 0.9)


def measurement_note(row: dict) -> str:
    """One line on how a run was measured and what its verdict means."""
    if "window_s" not in row:
        return (f"transient: a fixed number of sessions ({row['num_sessions']}), not a steady state; its figures "
                f"change with --num-sessions (drop it for a steady-state run)")
    window = (f"steady-state run: {row['warmup_s']:.0f} s warm-up, {row['num_sessions']} session(s) arrived in the "
              f"{row['window_s']:.0f} s window")
    if row["verdict"] == STABLE:
        return f"{window}; stable (its first half within 2 points)"
    if row["verdict"] == TRANSIENT:
        return f"{window}; transient: {row['reason']}"
    return f"{window}; unstable: {row['reason']}"


def cmd_sweep(args: argparse.Namespace) -> None:
    out_dir = output_dir(args, "out/sweep")
    base, sweep = config_from_args(args)
    sweep = _sweep_from_args(args, base, sweep)
    configs = plan_sweep(base, sweep)
    run = PointRunner(args.jobs, not args.quiet, ray_address=args.ray)
    rows = run(configs)
    capacities = sweep_capacities(sweep, configs, rows, run) if sweep.capacity else []
    c = base.cluster
    cluster = f"{c.model} on {c.num_gpus} x {c.gpu}"
    print_table(summary_table(f"{cluster}; {'; '.join(_workload_notes(rows))}; deployments: {_deployments(rows)}",
                              rows))
    transient = any(r["verdict"] == TRANSIENT for r in rows)
    print("transient runs (fixed session counts): figures change with --num-sessions" if transient else
          "steady-state runs; 'unstable' = overloaded (attainment still moving with the run's length)")
    if capacities:
        print_table(capacity_table("capacity: highest rate whose SLO attainment in steady state stays >= target",
                                   capacities))
    write_json(out_dir / "sweep.json", {"rows": rows, "capacities": capacities,
                                        "configs": [resolve_measure(x).model_dump(mode="json") for x in configs]})
    write_csv(out_dir / "sweep.csv", rows)
    from ampd.metrics.plot import plot_attainment  # here: matplotlib takes ~0.5 s to import, only sweep draws

    plot_attainment(rows, out_dir / "sweep.png", "\n".join([cluster, *_workload_notes(rows)]),
                    {(r["workload"], r["system"]): r["capacity_per_s"] for r in capacities})
    print(f"results in {out_dir}/ (sweep.json with every run's configuration, sweep.csv, sweep.png)")


def _workload_notes(rows: list[dict]) -> list[str]:
    """Each workload's SLO thresholds and arrivals, as the sweep's titles say them."""
    by_workload = {r["workload"]: (r["ttft_slo_s"], r["itl_slo_s"], r["scope"], arrivals_text(r)) for r in rows}
    return [f"{w}: SLO TTFT {t:.2f} s, ITL {1000 * i:.0f} ms ({scope}), {arrivals}"
            for w, (t, i, scope, arrivals) in by_workload.items()]


def _deployments(rows: list[dict]) -> str:
    by_system = {(r["workload"], r["system"]): r["deployment"] for r in rows}
    if len(set(by_system.values())) == 1:
        return next(iter(by_system.values()))
    return ", ".join(f"{s} ({w}) {d}" for (w, s), d in by_system.items())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ampd", description="AMPD: multi-round LLM serving on PD-disaggregated clusters")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="simulate one system at one rate")
    add_run_options(sim)
    sim.add_argument("--system", help=f"one of {', '.join(SYSTEMS)} (default: ampd)")
    sim.add_argument("--workload", help="toolbench|gaia|hotpotqa|dureader, builtin:<trace>, or a trace file")
    sim.add_argument("--rate", type=float, help="session arrival rate (sessions/s); default: a trace's own rate "
                                                "(its recorded times unchanged), 1 for a synthetic workload")
    sim.set_defaults(func=cmd_simulate)
    sw = sub.add_parser("sweep", help="simulate systems x workloads x rates; table and PNG")
    add_run_options(sw)
    sw.add_argument("--systems", type=_names,
                    help=f"comma-separated, of {', '.join(SYSTEMS)} (default: {','.join(DEFAULT_SWEEP_SYSTEMS)})")
    sw.add_argument("--workloads", type=_names, help="comma-separated workloads (as in simulate --workload)")
    sw.add_argument("--rates", type=_floats, help="comma-separated rates (sessions/s), every workload")
    sw.add_argument("--capacity", action="store_true", default=None,
                    help="also find each system's capacity (highest rate with >= 90 %% attainment, steady state)")
    sw.add_argument("--jobs", type=positive_int, help="parallel runs (default: every core)")
    sw.add_argument("--ray", metavar="ADDRESS", help="run the points on a Ray cluster (auto, ray://host:port, "
                                                      "or local); needs pip install 'ampd[ray]'")
    sw.add_argument("--quiet", action="store_true", help="no progress bar")
    sw.set_defaults(func=cmd_sweep)
    plan.register(sub)
    profile.register(sub)
    reproduce.register(sub)
    serve.register(sub)
    replay.register(sub)
    validate.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except AmpdError as err:
        print(f"ampd: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ampd: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
