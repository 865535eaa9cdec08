"""Command-line options shared by the subcommands, and how they override the
configuration file."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from ampd.config import RunConfig, SweepConfig, load_config, override, with_perf_model
from ampd.core.errors import InputError
from ampd.metrics.slo import SloScope
from ampd.policy.systems import DECODE_BATCHING_SETTINGS


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    return _int_at_least(text, 0, "an integer >= 0")


def _int_at_least(text: str, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a finite positive number, got {text!r}")
    return value


def add_run_options(p: argparse.ArgumentParser) -> None:
    """Options that override a RunConfig (each defaults to the config's value)."""
    p.add_argument("--config", help="TOML configuration file (fields: see docs/CONFIG.md)")
    p.add_argument("--model", help="a catalog model, e.g. Llama-3.1-70B, or a Hugging Face config.json "
                                   "(file or folder)")
    p.add_argument("--gpu", help="a catalog GPU, e.g. H20, or a TOML file of its figures (configs/gpus/)")
    p.add_argument("--perf-model", metavar="PATH", help="perf model file (alpha-beta JSON or profile) timing the "
                                                        "run instead of the catalog's; replaces the configuration's "
                                                        "perf_model, model and gpu (docs/CONFIG.md)")
    p.add_argument("--gpus", type=int, help="GPUs in the cluster")
    p.add_argument("--deployment", help="e.g. 'P:<TP=2,DP=2> D:<TP=4,DP=1>', or auto (default: the planner's)")
    p.add_argument("--decode-batching", choices=DECODE_BATCHING_SETTINGS,
                   help="how disaggregated decode workers run a local prefill: alternate (pause the batch), "
                        "chunked (mixed into decode steps), auto (default: the perf model's measurement, else "
                        "alternate)")
    p.add_argument("--num-sessions", type=int, help="run exactly this many sessions: a transient, not a steady "
                                                    "state (default: a steady-state run, see --window-s)")
    p.add_argument("--warmup-s", type=float, help="steady-state run: seconds of arrivals before the measurement "
                                                  "window (default: 2 SLO lifetimes, a session at its thresholds; "
                                                  "docs/SIMULATOR.md)")
    p.add_argument("--window-s", type=float, help="steady-state run: the measurement window, seconds (default: "
                                                  "10 lifetimes, at least 2,000 sessions)")
    p.add_argument("--drain-s", type=float, help="steady-state run: longest wait after the window for its "
                                                 "sessions (default: 10 lifetimes or a quarter of the window)")
    p.add_argument("--arrivals", choices=["poisson", "recorded"],
                   help="recorded (a trace's default: its own arrival times, rescaled only when a rate is given) "
                        "or poisson (a synthetic workload's default and only choice; a trace's sessions then "
                        "arrive at random at the rate)")
    p.add_argument("--trace-format", help="format of a trace file (default: guessed): ampd, trtllm, mooncake, "
                                          "tracelab, session-delay")
    p.add_argument("--seed", type=int, help="seed of the workload and the router")
    p.add_argument("--ttft-slo-s", type=float, help="TTFT threshold (default: derived, see docs)")
    p.add_argument("--itl-slo-s", type=float, help="ITL threshold (default: derived, see docs)")
    p.add_argument("--scope", choices=[s.value for s in SloScope], help="SLO scope: mean (default) or strict")
    p.add_argument("--alpha", type=float, help="Algorithm 1 prefill slack (0.9)")
    p.add_argument("--beta", type=float, help="Algorithm 1 decode slack (0.85)")
    p.add_argument("--reorder-window", type=int, help="Algorithm 2 window w (3)")
    p.add_argument("--out", help="directory for results (default: out/<command>/)")


def output_dir(args: argparse.Namespace, default: str) -> Path:
    """The results folder (``--out`` or ``default``), created now so that a path
    that cannot be written fails before any simulation runs.

    Raises:
        InputError: the folder cannot be created or is not a folder.
    """
    path = Path(args.out or default)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InputError(f"--out {path}: cannot create the results folder: {err.strerror or err}") from None
    if not os.access(path, os.W_OK):
        raise InputError(f"--out {path}: the results folder is not writable")
    return path


def _pick(**values) -> dict:
    return {k: v for k, v in values.items() if v is not None}


def config_from_args(args: argparse.Namespace) -> tuple[RunConfig, SweepConfig | None]:
    """The file's configuration (or the defaults) with the given options applied,
    and the file's sweep table if it has one.

    Raises:
        InputError: unreadable file or invalid field, named.
    """
    config, sweep = load_config(args.config) if args.config else (RunConfig(), None)
    if args.perf_model is not None:
        config = with_perf_model(config, args.perf_model)
    changes = {
        "cluster": _pick(model=args.model, gpu=args.gpu, num_gpus=args.gpus, deployment=args.deployment,
                         decode_batching=args.decode_batching),
        "slo": _pick(ttft_s=args.ttft_slo_s, itl_s=args.itl_slo_s, scope=args.scope),
        "policy": _pick(alpha=args.alpha, beta=args.beta, reorder_window=args.reorder_window),
        "workload": _pick(num_sessions=args.num_sessions, arrivals=args.arrivals, seed=args.seed,
                          trace_format=args.trace_format),
        "measure": _pick(warmup_s=args.warmup_s, window_s=args.window_s, drain_s=args.drain_s),
    }
    if args.seed is not None:
        changes["seed"] = args.seed
    return override(config, **{k: v for k, v in changes.items() if v != {}}), sweep
