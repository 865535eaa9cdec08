"""``ampd reproduce``: the paper's evaluation in the simulator (docs/RESULTS.md)."""

from __future__ import annotations

import argparse

from ampd.cli.options import output_dir
from ampd.reproduce import grid
from ampd.reproduce.report import write
from ampd.reproduce.run import Runner, prepare, run_ablation, run_grid, run_sensitivity, search_best


def cmd_reproduce(args: argparse.Namespace) -> None:
    out_dir = output_dir(args, "out/reproduce")
    run = Runner(out_dir, args.jobs, not args.quiet)
    print("finding each cell's knee")
    cells = prepare(grid.cells(args.quick), run)
    fractions = grid.QUICK_RATE_FRACTIONS if args.quick else grid.RATE_FRACTIONS
    print(f"{len(cells)} cells; searching each system's best deployment")
    best = search_best(cells, run)
    print("grid")
    grid_rows = run_grid(cells, best, fractions, run)
    print("ablation and sensitivity")
    ablation_rows = run_ablation(cells, best, fractions, run)
    sensitivity_rows = run_sensitivity(cells, best, run)
    tables = write(out_dir, args.quick, grid_rows, ablation_rows, sensitivity_rows, best)
    for g in tables["gains"]:
        if g["system"] in ("ampd", "ampd [planner]"):
            print(f"{g['system']} over {g['baseline']}: mean {g['mean_gain_pct']:+.1f} %, max {g['max_gain_pct']:+.1f} % "
                  f"({g['mean_gain_points']:+.1f} points on average)")
    print(f"results in {out_dir}/ (results.json, tables.md, attainment_grid.png, latency_breakdown.png, "
          f"ablation.png, sensitivity.png; points/ caches every simulation)")


def register(sub) -> None:
    """Add the ``reproduce`` subcommand."""
    p = sub.add_parser("reproduce", help="the paper's evaluation grid in the simulator")
    p.add_argument("--quick", action="store_true",
                   help="a smoke-sized grid: one model, 100-120 sessions, 3 rates (minutes); its figures are "
                        "noisier than the full grid's and not comparable with docs/RESULTS.md")
    p.add_argument("--jobs", type=int, help="parallel simulations (default: every core)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--out", help="results folder (default: out/reproduce/)")
    p.set_defaults(func=cmd_reproduce)
