"""``ampd reproduce``: the paper's evaluation in the simulator (docs/RESULTS.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ampd.cli.options import output_dir, positive_int
from ampd.reproduce import grid
from ampd.core.errors import InputError
from ampd.perf import load_perf_model
from ampd.reproduce.report import best_rows, write
from ampd.reproduce.run import (
    ablation_entries, grid_entries, prepare, run_capacities, run_points, run_sensitivity, search_best)
from ampd.run.runner import PointRunner


def cmd_reproduce(args: argparse.Namespace) -> None:
    out_dir = output_dir(args, "out/reproduce")
    if args.redraw:
        _redraw(out_dir)
        return
    run = PointRunner(args.jobs, not args.quiet, out_dir / "points", args.ray)
    print("finding each cell's reference capacity (plain PD disaggregation, even split)")
    model_file = (args.perf_model, load_perf_model(args.perf_model).model.name) if args.perf_model else None
    cells = prepare(grid.cells(args.quick, model_file), run)
    fractions = grid.QUICK_RATE_FRACTIONS if args.quick else grid.RATE_FRACTIONS
    print(f"{len(cells)} cells (synthetic workloads, Poisson arrivals); searching each system's best deployment")
    best = search_best(cells, run, args.quick)
    print("grid of rates, then each system's capacity")
    entries = grid_entries(cells, best)
    grid_rows = run_points(entries, fractions, run)
    capacities = run_capacities(entries, grid_rows, run)
    print("ablation and sensitivity")
    ablation = ablation_entries(cells, best)
    ablation_rows = run_points(ablation, fractions, run)
    results = {"references": [{"cell": p.cell.label, "reference_per_s": p.reference_per_s,
                               "met_slo": p.reference_met_slo} for p in cells],
               "grid": grid_rows, "capacities": capacities, "ablation": ablation_rows,
               "ablation_capacities": run_capacities(ablation, ablation_rows, run),
               "sensitivity": run_sensitivity(cells, best, run, args.quick), "best_deployments": best_rows(best)}
    _print_gains(write(out_dir, args.quick, results))
    print(f"results in {out_dir}/ (results.json, tables.md, attainment_grid.png, capacity.png, "
          f"latency_breakdown.png, ablation.png, sensitivity.png; points/ caches every simulation)")


def _redraw(out_dir: Path) -> None:
    """Tables and figures again from ``results.json``, without simulating."""
    path = out_dir / "results.json"
    try:
        results = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{path}: cannot read a reproduce run's results ({err}); run ampd reproduce first") from None
    try:
        tables = write(out_dir, results["quick"], results)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise InputError(f"{path}: not the results of this version of ampd reproduce ({type(err).__name__}: {err}); "
                         f"run ampd reproduce again") from None
    _print_gains(tables)
    print(f"tables and figures redrawn in {out_dir}/")


def _print_gains(tables: dict) -> None:
    for g in tables["capacity_gains"]:
        if g["system"].removesuffix(grid.PLANNED) in ("ampd", "ampd-predictive"):
            print(f"{g['system']} over {g['baseline']}: capacity {g['mean_capacity_gain_pct']:+.1f} % on average "
                  f"({g['min_capacity_gain_pct']:+.1f} to {g['max_capacity_gain_pct']:+.1f} % over "
                  f"{g['num_cells']} cells)")


def register(sub) -> None:
    """Add the ``reproduce`` subcommand."""
    p = sub.add_parser("reproduce", help="the paper's evaluation grid in the simulator")
    p.add_argument("--quick", action="store_true",
                   help="a smoke-sized grid: one model, five systems, 3 rates, the coarse deployment search; "
                        "same steady-state runs, fewer of them (not comparable with docs/RESULTS.md)")
    p.add_argument("--jobs", type=positive_int, help="parallel simulations (default: every core)")
    p.add_argument("--ray", metavar="ADDRESS", help="run the simulations on a Ray cluster (auto, "
                                                     "ray://host:port, or local); pip install 'ampd[ray]'")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--redraw", action="store_true", help="only redraw the tables and figures from the folder's "
                                                         "results.json (no simulation)")
    p.add_argument("--out", help="results folder (default: out/reproduce/)")
    p.add_argument("--perf-model", metavar="PATH", help="perf model file (alpha-beta JSON or profile): the grid "
                                                        "runs on its model alone, timed by it")
    p.set_defaults(func=cmd_reproduce)
