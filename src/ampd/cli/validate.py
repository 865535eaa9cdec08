"""``ampd validate``: the simulator, driven by a profile of the real engines, against the
real cluster on the same trace (docs/PROFILING.md, "Sim vs real")."""

from __future__ import annotations

import argparse
import dataclasses

from rich.table import Table

from ampd.cli.options import (add_run_options, config_from_args, non_negative_int, output_dir, positive_float,
                              positive_int)
from ampd.cli.profile import QUICK_GRID
from ampd.cli.tables import print_table
from ampd.metrics.report import round_rows, write_csv, write_json
from ampd.perf.perf_file import load_perf_model
from ampd.profile.run import ProfileGrid
from ampd.profile.validate import validate
from ampd.engines.mock.engine import DEFAULT_VOCAB_SIZE
from ampd.cluster.replay import DEFAULT_TIMEOUT_S
from ampd.serve.rounds.phases import PHASES

_ROWS = (("mean TTFT, relative error", "ttft_mean_rel_error", "{:.1%}"),
         ("mean ITL, relative error", "itl_mean_rel_error", "{:.1%}"),
         ("per-round TTFT, median relative error", "ttft_round_median_rel_error", "{:.1%}"),
         ("per-round ITL, median relative error", "itl_round_median_rel_error", "{:.1%}"),
         ("SLO attainment, difference (points)", "attainment_delta", "{:+.1f}"),
         ("rounds placed alike", "placement_agreement", "{:.1%}"),
         ("local prefill share (first side)", "local_share_real", "{:.1%}"),
         ("local prefill share (second side)", "local_share_sim", "{:.1%}"),
         ("sessions compared", "num_sessions", "{}"))
# The engines' own counters per real run (ampd.profile.engine_side) beside the run's own
# means (``compare``): where a gap lies.
_ENGINE_ROWS = (("ITL, simulated (ms)", "itl_sim_s", 1e3), ("ITL, decode engines' counter (ms)", "itl_engine_s", 1e3),
                ("ITL, client (ms)", "itl_client_s", 1e3),
                ("remote prefill, profile's T_pre (ms)", "remote_prefill_model_s", 1e3),
                ("remote prefill, prefill engines' counter (ms)", "remote_prefill_engine_s", 1e3),
                ("remote round, simulated history read (overlapping the previous task) (ms)", "remote_read_model_s",
                 1e3),
                ("remote round, simulated time on the prefill worker (ms)", "remote_compute_model_s", 1e3),
                ("remote round, simulated send to the first token (ms)", "remote_send_model_s", 1e3),
                ("remote rounds / prefills the engines counted", ("remote_rounds", "remote_prefills_engine"), None),
                ("KV transfer, engines' counter (ms)", "kv_xfer_engine_s", 1e3),
                ("KV transfers the engines counted", "kv_xfers_engine", None),
                ("TTFT, simulated (ms)", "sim_ttft_mean_s", 1e3), ("TTFT, client (ms)", "real_ttft_mean_s", 1e3),
                ("TTFT, prefill engines' counter (ms)", "ttft_prefill_engine_s", 1e3),
                ("  of which queued (ms)", "queue_prefill_engine_s", 1e3),
                ("TTFT, decode engines' counter (ms)", "ttft_decode_engine_s", 1e3),
                ("  of which queued (ms)", "queue_decode_engine_s", 1e3),
                ("TTFT, the profile's serving path (ms)", "serving_path_model_s", 1e3))


def _engine_cell(side: dict, key: str | tuple[str, str], scale: float | None) -> str:
    if isinstance(key, tuple):
        return " / ".join(str(side[k]) for k in key)
    value = side[key]
    if value is None:
        return "-"
    return f"{value * scale:.1f}" if scale else str(value)


def cmd_validate(args: argparse.Namespace) -> None:
    config, _ = config_from_args(args)
    out_dir = output_dir(args, "out/validate")
    grid = QUICK_GRID if args.quick_profile else ProfileGrid()
    if args.serving_load_batch is not None:
        grid = dataclasses.replace(grid, serving_load_batch=args.serving_load_batch)
    result = validate(config, out_dir, args.repeats, args.vocab_size, args.timeout_s, args.max_model_len, grid,
                      not args.quiet, args.profile_now, not args.no_stack_calibration)
    table = Table(title=f"sim vs real: {config.system}, {config.cluster.deployment}, profile {result.profile_path}; "
                        f"{len(result.sim.result.sessions)} sessions ({result.clipped_rounds} rounds beyond "
                        f"max_model_len left out)")
    table.add_column("figure")
    for i in range(len(result.figures)):
        table.add_column(f"real run {i + 1} vs sim", justify="right")
    if result.spread is not None:
        table.add_column("real run 2 vs real run 1", justify="right")
    for label, key, form in _ROWS:
        cells = [form.format(f[key]) for f in result.figures]
        table.add_row(label, *cells, *([form.format(result.spread[key])] if result.spread else []))
    print_table(table)
    engines = Table(title="where the gap lies: the engines' own counters over each real run")
    engines.add_column("figure")
    for i in range(len(result.engine_side)):
        engines.add_column(f"real run {i + 1}", justify="right")
    for label, key, scale in _ENGINE_ROWS:
        engines.add_row(label, *(_engine_cell({**figures, **side}, key, scale)
                                 for figures, side in zip(result.figures, result.engine_side)))
    for route, names in PHASES.items():  # the coordinators' split of the client's TTFT
        if not any(route in side["coordinator_phases"] for side in result.engine_side):
            continue
        for name in names:
            engines.add_row(f"TTFT of a {route} round, coordinator's {name} phase (ms)",
                            *(_engine_cell(side["coordinator_phases"].get(route, {f"{name}_s": None}), f"{name}_s", 1e3)
                              for side in result.engine_side))
    parts = sorted({name for side in result.engine_side for name in side["cpu_per_wall_s"]})
    for name in parts:  # who used the host's cores while the run was served
        engines.add_row(f"CPU of {name}, seconds per wall second ({result.engine_side[0]['cpu_count']} cores)",
                        *(f"{side['cpu_per_wall_s'].get(name, 0.0):.2f}" for side in result.engine_side))
    print_table(engines)
    stack = load_perf_model(result.profile_path).measured.serving_stack
    if stack is not None:
        print("serving stack the simulator adds (coordinators and client, ms): "
              + ", ".join(f"{name.removesuffix('_s')} {1e3 * value:.1f}" for name, value in stack._asdict().items()))
    failed = sum(len(run.failed) for run in result.runs)
    write_json(out_dir / "validate.json", {
        "config": config.model_dump(mode="json"), "profile": str(result.profile_path),
        "sim_verdict": result.sim.stability.verdict, "clipped_rounds": result.clipped_rounds,
        "real_vs_sim": result.figures, "real_vs_real": result.spread, "engine_side": result.engine_side,
        "serving_stack": None if stack is None else stack._asdict(), "failed_sessions": failed})
    write_csv(out_dir / "rounds-sim.csv", round_rows(result.sim.result.sessions))
    for i, run in enumerate(result.runs):
        write_csv(out_dir / f"rounds-real-{i + 1}.csv", round_rows(run.sessions))
    from ampd.profile.plots import plot_sim_vs_real  # here: matplotlib takes ~0.5 s to import, only this draws

    plot = plot_sim_vs_real([run.sessions for run in result.runs], result.sim.result.sessions,
                            f"{config.system} on {config.cluster.deployment}", out_dir / "sim_vs_real.png")
    print(f"{failed} sessions failed in the real runs" if failed else "no session failed in the real runs")
    print(f"results in {out_dir}/ (validate.json, {plot.name}, rounds-sim.csv, rounds-real-*.csv, profile and logs)")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``ampd validate`` to the ``ampd`` command."""
    p = sub.add_parser("validate", help="simulate a configuration with a profile of its engines and replay the same "
                                        "trace on them: sim vs real, side by side", description=__doc__)
    add_run_options(p)
    p.add_argument("--repeats", type=positive_int, default=2,
                   help="real runs (default 2: their spread is the yardstick for the errors)")
    p.add_argument("--profile-now", action="store_true",
                   help="profile the engines first even where the configuration or --perf-model names a profile "
                        "(its model and GPU kept): on a host whose speed drifts, a profile of another hour times "
                        "another machine (docs/PROFILING.md)")
    p.add_argument("--no-stack-calibration", action="store_true",
                   help="do not serve a calibration trace first to measure the coordinators' and the client's "
                        "share of a round (the simulator then times the engines' requests alone, or by the "
                        "profile's serving_stack where it has one)")
    p.add_argument("--quick-profile", action="store_true", help="when profiling: ampd profile --quick's grid")
    p.add_argument("--serving-load-batch", type=non_negative_int,
                   help="when profiling: ampd profile --serving-load-batch (default 4; 0 with --quick-profile)")
    p.add_argument("--max-model-len", type=positive_int, default=4096,
                   help="the engines' context limit; later rounds are left out of the trace (default 4096)")
    p.add_argument("--vocab-size", type=positive_int, default=DEFAULT_VOCAB_SIZE,
                   help=f"prompt token ids are drawn from [0, vocab size) (default {DEFAULT_VOCAB_SIZE})")
    p.add_argument("--timeout-s", type=positive_float, default=DEFAULT_TIMEOUT_S,
                   help=f"fail a round after this many wall seconds without reply (default {DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_validate)
