"""``ampd profile``: measure running engines and fit AMPD's cost model (docs/PROFILING.md)."""

from __future__ import annotations

import argparse
import dataclasses

from ampd.cli.options import non_negative_int, output_dir, positive_int
from ampd.cli.tables import fit_table, print_table
from ampd.perf.resolve import resolve_gpu, resolve_model
from ampd.profile.profile_file import profile_document, write
from ampd.profile.run import ProfileGrid, run

# [our choice] --quick: a grid a mock engine answers in seconds and a tiny model on 2
# CPU cores in about a minute; enough points for every fit, one repeat, on idle engines
# (no serving load: its batches' warm-ups would be most of a quick profile).
QUICK_GRID = ProfileGrid(hist_tokens=(0, 512), new_tokens=(32, 128, 512, 2048), batch_sizes=(1, 4, 8),
                         decode_prompt_tokens=(128, 512), kv_tokens=(256, 1024, 2048),
                         remote_hist_tokens=(0, 256, 1024), remote_new_tokens=(32, 512), repeats=1, warmup=1,
                         serving_load_batch=0)


def cmd_profile(args: argparse.Namespace) -> None:
    out_dir = output_dir(args, "out/profile")
    model, gpu = resolve_model(args.model), resolve_gpu(args.gpu)
    grid = QUICK_GRID if args.quick else ProfileGrid()
    if args.repeats is not None:
        grid = dataclasses.replace(grid, repeats=args.repeats)
    if args.max_num_batched_tokens is not None:
        grid = dataclasses.replace(grid, chunk_tokens=args.max_num_batched_tokens)
    if args.serving_load_batch is not None:
        grid = dataclasses.replace(grid, serving_load_batch=args.serving_load_batch)
    points, fingerprints, fits = run(args.decode_url, args.prefill_url, grid, args.seed, not args.quiet)
    document = profile_document(points, fingerprints, fits, model, gpu, args.tp, grid, args.seed)
    path = write(document, out_dir / "profile.json")
    engine = fingerprints["decode_engine"]
    title = f"{engine['model']} on {' '.join(filter(None, (engine['engine'], engine.get('engine_version'))))}, TP={args.tp}"
    from ampd.profile.plots import plot_profile  # here: matplotlib takes ~0.5 s to import, only profile draws

    plots = plot_profile(points, fits, title, out_dir)
    remote = fits["remote"] or {}
    named = [("T_pre", fits["prefill"]), ("T_dec", fits["decode"]), ("T_kv", fits["kv"]),
             ("remote: history export", remote.get("export")), ("remote: prefill request", remote.get("prefill")),
             ("remote: join", remote.get("join"))]
    print_table(fit_table(f"profile of {title}", [(name, fit) for name, fit in named if fit is not None]))
    mode = fits["batching"]
    print(f"local prefill on the decode engine: {mode['mode']}"
          + (f", {mode['chunk_tokens']} tokens per step (from the {mode['chunk_tokens_from']})"
             if mode["mode"] == "chunked" else ""))
    if fits["request_overhead_s"] is not None:
        print(f"serving path of one engine request: {1000 * fits['request_overhead_s']:.1f} ms "
              f"(beyond the engine's own TTFT)")
    if fits["remote_paths_s"] is not None:
        paths = fits["remote_paths_s"]
        print(f"serving path of a remote round's requests: export {1000 * paths.export:.1f} ms, prefill "
              f"{1000 * paths.prefill:.1f} ms, join {1000 * paths.join:.1f} ms")
    shared = fits["shared_host"]
    if shared is not None:
        print(f"decode steps beside the computing prefill engine: {shared['ratio_of_medians']:.2f} x idle "
              f"({'every busy run slower' if shared['separated'] else 'the runs overlap'}); the model uses "
              f"x{shared['decode_step_factor']:.2f}")
    print(f"profile in {path} (use it with --perf-model {path}); plots: {', '.join(p.name for p in plots)}")


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``ampd profile`` to the ``ampd`` command."""
    p = sub.add_parser("profile", help="measure running engines; fit T_pre, T_dec, T_kv; write profile.json",
                       description=__doc__)
    p.add_argument("--decode-url", required=True, help="a decode engine (OpenAI API + /metrics): T_pre, T_dec and "
                                                       "how it mixes a local prefill into decode steps")
    p.add_argument("--prefill-url", help="a prefill engine with a KV connector to the decode engine: T_kv, and a "
                                        "remote round's requests when the decode engine exports history")
    p.add_argument("--model", required=True, help="the engines' model: a catalog name or a Hugging Face config.json "
                                                  "(file or folder): the shape of the KV cache and weights")
    p.add_argument("--gpu", required=True, help="the engines' GPU: a catalog name or a TOML file of its figures "
                                                "(configs/gpus/)")
    p.add_argument("--tp", type=positive_int, default=1, help="the engines' tensor-parallel degree (default 1)")
    p.add_argument("--quick", action="store_true", help="a small grid, one repeat (about a minute on a CPU)")
    p.add_argument("--repeats", type=positive_int, help="probes per grid point (default 3; 1 with --quick)")
    p.add_argument("--max-num-batched-tokens", type=positive_int,
                   help="the decode engine's token budget per step, as it was started with (vLLM does not report "
                        "it); default: searched for with mixed probes, which a noisy machine can mislead")
    p.add_argument("--serving-load-batch", type=non_negative_int,
                   help="sequences the decode engine streams while a remote round's requests and the serving path "
                        "are timed, as under serving (default 4; 0 with --quick; 0: an idle engine)")
    p.add_argument("--seed", type=int, default=0, help="prompts and the held-out split (default 0)")
    p.add_argument("--out", help="output folder (default out/profile)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_profile)
