"""Helpers of the real-vLLM tests: what a stream and an engine's counters say.
The servers and the tiny model: ``ampd.engines.local_vllm``."""

import json
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ampd.engines.local_vllm import CHECKOUT

ROOT = CHECKOUT
VOCAB = range(3, 2048)  # the tiny model's ordinary tokens (0-2 are special)


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
