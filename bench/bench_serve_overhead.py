"""Coordinator overhead per round: the latency the coordinator adds over calling
the engines directly, with mock engines (real time, Llama-3.1-8B on H100 timings)
and the shared state in a real Redis server.

Local rounds: client -> engine vs client -> coordinator -> engine (a colocated
system, every prefill local). Remote rounds: client -> prefill engine -> decode
engine (the client doing the two steps itself) vs client -> coordinator (queue,
dispatch, both steps). Rounds run one at a time on fresh sessions (512-token
prompts, 16 output tokens), so engine time is the same on both paths; the medians'
difference is the overhead (TTFT, whole round, and per output token). Also the
coordinator's CPU time per round: its process's user + system time over the
measured rounds (``psutil``), divided by their number.

Run: ``python bench/bench_serve_overhead.py`` -> ``bench/results/serve_overhead.json``.
With ``--baseline-src DIR`` (the ``src`` of another checkout, e.g. ``git worktree add
/tmp/before <rev>``), the same measurement of that checkout's coordinator first, in
the same run, written beside this one's under ``baseline``.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
import psutil  # noqa: E402
from common import stream_round, with_baseline, write_result  # noqa: E402

from ampd.config import RunConfig  # noqa: E402
from ampd.cluster.up import LocalCluster, free_serve_ports  # noqa: E402

ROUNDS = 60
PROMPT_TOKENS, OUTPUT_TOKENS = 512, 16
CLUSTER = {"model": "Llama-3.1-8B", "gpu": "H100-SXM", "num_gpus": 2}


def _config(system: str, deployment: str) -> RunConfig:
    return RunConfig(system=system, cluster={**CLUSTER, "deployment": deployment},
                     workload={"name": "toolbench", "num_sessions": 5},
                     serve={**free_serve_ports()})


def _body(rng: random.Random, **extra) -> dict:
    return {"model": CLUSTER["model"], "prompt": [rng.randrange(32000) for _ in range(PROMPT_TOKENS)],
            "max_tokens": OUTPUT_TOKENS, "stream": True, "return_token_ids": True, **extra}


async def _direct_remote(client: httpx.AsyncClient, prefill_url: str, decode_url: str, body: dict, session_id: str):
    start = time.perf_counter()
    params = {"do_remote_decode": True, "do_remote_prefill": False, "ampd_hist_tokens": 0, "ampd_decode_tp": 1,
              "ampd_decode_server": 0}
    reply = await client.post(f"{prefill_url}/v1/completions", headers={"X-Session-Id": session_id},
                              json={**body, "max_tokens": 1, "stream": False, "kv_transfer_params": params})
    ttft, total, tokens = await stream_round(client, decode_url, "/v1/completions", {
        **body, "kv_transfer_params": reply.json()["kv_transfer_params"]}, session_id)
    elapsed = time.perf_counter() - start
    return ttft + elapsed - total, elapsed, tokens


async def _measure(paths: dict, coordinator: psutil.Process) -> tuple[dict, float]:
    """Samples of each path, and the coordinator's CPU seconds per measured round."""
    samples = {name: [] for name in paths}
    rng = random.Random(0)
    async with httpx.AsyncClient(timeout=60) as client:
        for i in range(ROUNDS + 5):
            if i == 5:  # warm-up rounds left out
                cpu = coordinator.cpu_times()
            for name, call in paths.items():
                result = await call(client, _body(rng), f"{name}-{i}")
                if i >= 5:
                    samples[name].append(result)
    after = coordinator.cpu_times()
    return samples, (after.user + after.system - cpu.user - cpu.system) / ROUNDS


def _medians(samples: list[tuple[float, float, int]]) -> dict:
    return {"ttft_ms": 1e3 * statistics.median(s[0] for s in samples),
            "round_ms": 1e3 * statistics.median(s[1] for s in samples)}


def _overhead(name: str, base: dict, through: dict) -> dict:
    return {f"{name}_direct_ttft_ms": base["ttft_ms"], f"{name}_coordinator_ttft_ms": through["ttft_ms"],
            f"{name}_ttft_overhead_ms": through["ttft_ms"] - base["ttft_ms"],
            f"{name}_round_overhead_ms": through["round_ms"] - base["round_ms"],
            f"{name}_per_token_overhead_ms": (through["round_ms"] - base["round_ms"]
                                              - (through["ttft_ms"] - base["ttft_ms"])) / (OUTPUT_TOKENS - 1)}


def measure() -> dict:
    """Every figure of this checkout's coordinator (module docstring)."""
    figures = {}
    with tempfile.TemporaryDirectory() as logs:
        with LocalCluster(_config("vllm", "D:<TP=1,DP=1>"), Path(logs) / "local") as cluster:
            engine, coordinator = cluster.config.serve.workers[0].url, cluster.urls[0]
            samples, cpu_s = asyncio.run(_measure({
                "direct": lambda c, b, s: stream_round(c, engine, "/v1/completions", b, s),
                "coordinator": lambda c, b, s: stream_round(c, coordinator, "/v1/completions", b, s)},
                psutil.Process(cluster.child("coordinator-0").process.pid)))
            figures.update(_overhead("local", _medians(samples["direct"]), _medians(samples["coordinator"])))
            figures["local_coordinator_cpu_ms_per_round"] = 1e3 * cpu_s
        with LocalCluster(_config("pd-disagg", "P:<TP=1,DP=1> D:<TP=1,DP=1>"), Path(logs) / "remote") as cluster:
            prefill, decode = (w.url for w in cluster.config.serve.workers)
            coordinator = cluster.urls[0]
            samples, cpu_s = asyncio.run(_measure({
                "direct": lambda c, b, s: _direct_remote(c, prefill, decode, b, s),
                "coordinator": lambda c, b, s: stream_round(c, coordinator, "/v1/completions", b, s)},
                psutil.Process(cluster.child("coordinator-0").process.pid)))
            figures.update(_overhead("remote", _medians(samples["direct"]), _medians(samples["coordinator"])))
            figures["remote_coordinator_cpu_ms_per_round"] = 1e3 * cpu_s
    return figures


def main() -> None:
    figures = with_baseline(__doc__, measure)
    for k, v in figures.items():
        if k != "baseline":
            print(f"{k}: {v:.2f}")
    write_result("serve_overhead", {"rounds": ROUNDS, "prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS,
                                    "store": "redis", "engines": "mock, time scale 1", **figures})


if __name__ == "__main__":
    main()
