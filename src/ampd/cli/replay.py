"""``ampd replay``: the open-loop load generator from the command line
(``ampd.cluster.replay``); sessions and SLO thresholds resolved as ``ampd simulate``
resolves them, results written in the same files."""

from __future__ import annotations

import argparse
import sys
import time

import httpx

from ampd.cli.options import add_run_options, config_from_args, output_dir, positive_float, positive_int
from ampd.cli.tables import arrivals_text, print_table, summary_table
from ampd.config import override
from ampd.core.errors import InputError
from ampd.run.resolve import arrivals_scale, measure_for, perf_model_for, rate_for, sessions_for, slo_for
from ampd.metrics.report import round_rows, write_csv, write_json
from ampd.core.clock import ScaledClock
from ampd.cluster.replay import DEFAULT_TIMEOUT_S, DEFAULT_VOCAB_SIZE, ReplayResult, replay_sync
from ampd.run.sweep import resolve_measure, workload_source


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ampd replay``: simulate's run options (configuration,
    workload size, seed, SLO) plus the server and replay settings."""
    add_run_options(parser)
    parser.add_argument("--url", help="base URL of the server (default: http://<serve.host>:<serve.port> of "
                                      "the configuration)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--trace", help="trace file (any format ampd loads, see --trace-format) or builtin:<trace>")
    source.add_argument("--workload", help="toolbench|gaia|hotpotqa|dureader, builtin:<trace>, or a trace file")
    parser.add_argument("--rate", type=float, help="session arrival rate (sessions/s)")
    parser.add_argument("--served-model", help="the requests' model field (default: the configuration's model)")
    parser.add_argument("--time-scale", type=positive_float,
                        help="wall seconds per model second; < 1 replays faster; must match the server's "
                             "(default: serve.time_scale of the configuration, 1)")
    parser.add_argument("--vocab-size", type=positive_int, default=DEFAULT_VOCAB_SIZE,
                        help=f"prompt token ids are drawn from [0, vocab size) (default {DEFAULT_VOCAB_SIZE})")
    parser.add_argument("--timeout-s", type=positive_float, default=DEFAULT_TIMEOUT_S,
                        help=f"fail a round after this many wall seconds without reply (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--wait-s", type=positive_float, default=180.0,
                        help="wait this long (wall seconds) for the server's /health before replaying (default 180: "
                             "a cluster `ampd up` is still starting)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def wait_until_ready(url: str, wait_s: float) -> None:
    """Return once ``GET {url}/health`` answers 200.

    Raises:
        InputError: nothing answered within ``wait_s`` wall seconds (names the URL).
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.InvalidURL as err:
            raise InputError(f"--url {url!r}: not a valid URL ({err})") from None
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise InputError(f"no server answered at {url}/health within {wait_s:g} s "
                             "(is `ampd up` or `ampd serve` running there?)")
        time.sleep(0.5)


def run_from_args(args: argparse.Namespace) -> ReplayResult:
    """``ampd replay``: resolve the sessions and thresholds as ``ampd simulate``
    does, replay, print the summary table, and write ``config.json``,
    ``summary.json`` (with the replay settings and failures) and ``rounds.csv``.

    Raises:
        InputError: a bad option, workload or trace.
    """
    config, _ = config_from_args(args)
    out_dir = output_dir(args, "out/replay")
    workload = {"rate_per_s": args.rate} if args.rate is not None else {}
    if args.trace is not None:
        workload.update({"name": None, "trace": args.trace})
    elif args.workload is not None:
        workload.update(workload_source(args.workload))
    config = resolve_measure(override(config, workload=workload))
    plan = measure_for(config)
    sessions = sessions_for(config, plan)
    slo = slo_for(config, perf_model_for(config))
    config = override(config, slo={"ttft_s": slo.ttft_s, "itl_s": slo.itl_s})
    model = args.served_model or config.serve.served_model or config.cluster.model
    args.url = args.url or f"http://{config.serve.host}:{config.serve.port}"
    args.time_scale = args.time_scale or config.serve.time_scale
    wait_until_ready(args.url, args.wait_s)
    result = replay_sync(args.url, sessions, model=model, clock=ScaledClock(args.time_scale), ttft_slo_s=slo.ttft_s,
                         itl_slo_s=slo.itl_s, scope=config.slo.scope, vocab_size=args.vocab_size, seed=config.seed,
                         timeout_s=args.timeout_s, progress=not args.quiet, plan=plan)
    row = {"system": config.system, "workload": config.workload.label, "rate_per_s": rate_for(config),
           "arrivals": config.workload.arrival_process, "arrivals_scale": arrivals_scale(config),
           **result.summary.to_dict(), **result.stability.to_dict()}
    print_table(summary_table(f"replay against {args.url} ({model}, time scale {args.time_scale:g}); "
                              f"SLO TTFT {slo.ttft_s:.2f} s, ITL {1000 * slo.itl_s:.0f} ms "
                              f"({config.slo.scope.value} scope); {arrivals_text(row)}", [row]))
    print(f"{result.stability.verdict}: {result.stability.reason}" if result.stability.reason else
          result.stability.verdict)
    write_json(out_dir / "config.json", config.model_dump(mode="json"))
    write_json(out_dir / "summary.json", {
        **row, "ttft_slo_s": slo.ttft_s, "itl_slo_s": slo.itl_s, "url": args.url, "served_model": model,
        "time_scale": args.time_scale, "vocab_size": args.vocab_size, "timeout_s": args.timeout_s,
        "wall_s": result.wall_s, "num_failed": len(result.failed),
        "failed": [{"session_id": s, "round_index": r, "reason": why} for s, r, why in result.failed]})
    write_csv(out_dir / "rounds.csv", round_rows(result.sessions))
    if result.failed:
        session_id, round_index, reason = result.failed[0]
        print(f"{len(result.failed)} of {len(sessions)} sessions failed; first: {session_id} round {round_index}: "
              f"{reason}", file=sys.stderr)
    print(f"results in {out_dir}/ (summary.json, rounds.csv, config.json)")
    return result


def cmd_replay(args: argparse.Namespace) -> None:
    result = run_from_args(args)
    if result.failed:
        raise SystemExit(1)


def register(sub) -> None:
    replay = sub.add_parser("replay", help="replay a trace or workload against a serving URL (open loop)")
    add_arguments(replay)
    replay.set_defaults(func=cmd_replay)
