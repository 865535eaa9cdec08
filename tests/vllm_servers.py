"""Real vLLM servers for the tests and benchmarks: the tiny model, and a set of
servers started, awaited and stopped together. They need `.venv-vllm` (`make test`
builds it with tools/vllm_venv.sh; AMPD_VLLM_PYTHON names another interpreter)."""

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ampd.engines.vllm_launch import ServerSpec, start_server, stop_server, wait_ready

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = Path(os.environ.get("AMPD_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
MODEL_NAME = "tiny-llama"
VOCAB = range(3, 2048)  # the tiny model's ordinary tokens (0-2 are special)
READY_TIMEOUT_S = 400  # a server starts in 30-60 s on 2 idle cores; several at once, under load, far slower


def tiny_model(work: Path, tokenizer: str = "words") -> Path:
    """Write tools/tiny_model.py's model into ``work/model`` (``tokenizer``
    "bytes": the byte-level one, which spells JSON); fail the test when there is
    no vLLM interpreter."""
    if not VLLM_PYTHON.exists():
        pytest.fail(f"no vLLM interpreter at {VLLM_PYTHON}: run `make test` (it builds .venv-vllm), "
                    "or set AMPD_VLLM_PYTHON")
    model_dir = work / "model"
    subprocess.run([str(VLLM_PYTHON), str(ROOT / "tools" / "tiny_model.py"), str(model_dir), "--tokenizer", tokenizer],
                   check=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True)
    return model_dir


@contextlib.contextmanager
def running(specs: dict[str, ServerSpec], work: Path) -> Iterator[dict]:
    """Start every server (logs ``work/<name>.log``), wait until all answer, yield
    their processes by name (a test may replace one), stop them all at the end."""
    processes = {name: start_server(spec, work / f"{name}.log") for name, spec in specs.items()}
    try:
        for name, spec in specs.items():
            wait_ready(processes[name], spec, work / f"{name}.log", timeout_s=READY_TIMEOUT_S)
        yield processes
    finally:
        for process in processes.values():
            stop_server(process)


def sse_tokens(sse: str) -> list[int]:
    """The token ids of a streamed completion (Server-Sent Events text), in order;
    an ``error`` event (vLLM's failure after HTTP 200) fails the test."""
    ids = []
    for line in sse.splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            event = json.loads(line[5:])
            assert "error" not in event, event
            for choice in event.get("choices", []):
                ids.extend(choice.get("token_ids") or [])
    return ids


def engine_counters(url: str) -> dict[str, float]:
    """The engine's counters of interest, summed over its label sets."""
    wanted = {"vllm:prompt_tokens_by_source": "source", "vllm:nixl_bytes_transferred": None,
              "vllm:nixl_num_kv_expired_reqs": None, "vllm:nixl_num_failed_transfers": None}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        if family.name not in wanted:
            continue
        for sample in family.samples:
            if sample.name.endswith(("_created", "_bucket", "_count")):
                continue
            label = wanted[family.name]
            key = f"{family.name}:{sample.labels[label]}" if label else sample.name
            out[key] = out.get(key, 0.0) + sample.value
    return out


def settled_counters(url: str, quiet_s: float = 1.0, timeout_s: float = 30.0) -> dict[str, float]:
    """The engine's counters once two reads ``quiet_s`` apart agree: vLLM reports
    NIXL transfer statistics from its worker a step or more after the transfer."""
    deadline = time.monotonic() + timeout_s
    last = engine_counters(url)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = engine_counters(url)
        if now == last:
            break
        last = now
    return last
