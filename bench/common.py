"""Shared by the benchmarks: where results go and what machine produced them, a
streamed round, and the real-vLLM setups several benchmarks run."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from ampd.metrics.report import write_json

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
REPRODUCE_OUT = ROOT / "out" / "reproduce"
"""``ampd reproduce``'s output: its ``results.json`` and its point cache ``points/``, which the
grid benchmarks read and extend."""


def jobs_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's parser, described by the first line of ``doc``, with ``--jobs``
    (parallel simulations; default every core)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=None, help="parallel simulations (default: every core)")
    return parser


def machine() -> dict:
    """The machine a figure was measured on."""
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": sys.version.split()[0]}


def with_baseline(doc: str, measure) -> dict:
    """Run a benchmark's ``measure()`` (its figures, a JSON-able dict) for this checkout
    and, with ``--baseline-src DIR`` on the command line (the ``src`` folder of another
    checkout, e.g. ``git worktree add /tmp/before <rev>``), first for that one: the same
    script in a child process whose package (and every server it starts, which inherit
    ``PYTHONPATH``) is the baseline's. Returns this checkout's figures, with the
    baseline's under ``baseline`` (and its commit). ``doc``: the script's docstring."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--baseline-src", type=Path, help="src folder of a baseline checkout, measured first")
    parser.add_argument("--figures-only", action="store_true", help=argparse.SUPPRESS)  # the baseline's child run
    args = parser.parse_args()
    if args.figures_only:
        print(json.dumps(measure()))
        sys.exit(0)
    figures = {}
    if args.baseline_src:
        child = subprocess.run([sys.executable, sys.argv[0], "--figures-only"], check=True, capture_output=True,
                               text=True, env={**os.environ, "PYTHONPATH": str(args.baseline_src.resolve())})
        commit = subprocess.run(["git", "-C", str(args.baseline_src), "rev-parse", "HEAD"], check=True,
                                capture_output=True, text=True).stdout.strip()
        figures["baseline"] = {"commit": commit, **json.loads(child.stdout.splitlines()[-1])}
    return {**figures, **measure()}


def write_result(name: str, figures: dict) -> Path:
    """Write ``bench/results/<name>.json`` with the figures, the machine and the time."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "machine": machine(), **figures}
    write_json(path, payload)  # NaN and infinities as null: standard JSON, as tests/test_docs.py checks
    print(f"wrote {path}")
    return path


async def stream_round(client, url: str, path: str, body: dict, session_id: str) -> tuple[float, float, int]:
    """(TTFT, round time, tokens) of one streamed request (``body`` asks for
    ``token_ids``) to ``url + path`` in session ``session_id``, wall seconds;
    an HTTP error raises (``httpx.HTTPStatusError``)."""
    import time

    start, first, tokens = time.perf_counter(), None, 0
    async with client.stream("POST", f"{url}{path}", json=body, headers={"X-Session-Id": session_id}) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                ids = (json.loads(line[5:]).get("choices") or [{}])[0].get("token_ids") or []
                if ids and first is None:
                    first = time.perf_counter() - start
                tokens += len(ids)
    return first, time.perf_counter() - start, tokens



# The tiny model's config.json, in a folder named as the served model (a spec's name), and
# this machine's CPU as the "GPU" its cost model is fitted on.
TINY_MODEL_CONFIG = ROOT / "tests" / "data" / "hf_configs" / "tiny-llama" / "config.json"
VLLM_CPU_GPU = ROOT / "configs" / "gpus" / "vllm-cpu-host.toml"


def nixl_pair(model_dir: Path) -> dict:
    """A prefill and a decode ``ServerSpec`` of the tiny model with what ``ampd up``
    gives a ``vllm-nixl`` engine (configs/serve_vllm_nixl_cpu.toml), on free ports."""
    from ampd.cluster.up import free_port_block
    from ampd.engines.local_vllm import MODEL_NAME, VLLM_PYTHON
    from ampd.engines.vllm_launch import NixlConnector, ServerSpec

    return {role: ServerSpec(role=role, python=VLLM_PYTHON, model_dir=model_dir, port=free_port_block(1),
                             connector=NixlConnector(free_port_block(1), load_failure_policy="fail", bidirectional=True,
                                                     decoder_kv_blocks_ttl_s=120, ucx_tls="tcp"),
                             served_model_name=MODEL_NAME) for role in ("prefill", "decode")}


# The sim-vs-real experiment (bench_sim_vs_real.py; bench_vllm_shm_spin.py reruns it under
# other engine settings): ToolBench-like sessions on the tiny model's NIXL cluster.
SIM_VS_REAL_PROFILE = RESULTS / "sim_vs_real_profile.json"
SIM_VS_REAL_RATE_PER_S = 0.25
TINY_VOCAB_SIZE = 2048  # the tiny model's (ampd.engines.tiny_model)
TINY_MAX_MODEL_LEN = 4096


def sim_vs_real_config(model_dir: Path, num_sessions: int = 24):
    """configs/serve_vllm_nixl_cpu.toml's cluster as a ``RunConfig``, with no perf
    model: ``validate`` profiles its engines first."""
    from ampd.cluster.up import free_serve_ports
    from ampd.config import RunConfig
    from ampd.engines.local_vllm import MODEL_NAME, VLLM_PYTHON

    return RunConfig(system="ampd-predictive",
                     cluster={"model": str(TINY_MODEL_CONFIG), "gpu": str(VLLM_CPU_GPU), "num_gpus": 2,
                              "deployment": "P:<TP=1,DP=1> D:<TP=1,DP=1>", "decode_batching": "chunked"},
                     policy={"chunk_tokens": 2048},
                     workload={"name": "toolbench", "num_sessions": num_sessions,
                               "rate_per_s": SIM_VS_REAL_RATE_PER_S},
                     serve={**free_serve_ports(coordinators=1, engines=2), "engine": "vllm-nixl",
                            "served_model": MODEL_NAME, "vllm_model": str(model_dir), "vllm_python": str(VLLM_PYTHON),
                            "kv_timeout_s": 120, "nixl_ucx_tls": "tcp", "nixl_decoder_kv_ttl_s": 120})
