"""A NIXL engine pair's first contact, made before traffic: one KV transfer each way.

The first transfer between two NIXL engines waits for their handshake (seconds, and a
minute once on 2 loaded cores; docs/SERVING.md, "First contact"), and in a
bidirectional pair each direction has its own: the decode engine reading a prefill's
KV, the prefill engine reading a history the decode engine holds. A measurement that
compares a cluster with a simulator (which has no handshakes) or with an earlier run
makes both before its first round, as ``tests/test_serve_vllm_nixl.py`` does.
"""

from __future__ import annotations

import httpx

from ampd.engines.history_export import EXPORT_PARAMS


async def warm_nixl_pair(prefill_url: str, decode_url: str, model: str, prompt: list[int], timeout_s: float) -> None:
    """One transfer each way between ``prefill_url`` and ``decode_url``: the decode
    engine reads ``prompt``'s KV from the prefill engine; then the prefill engine reads
    it back from the decode engine's hold (with one more block of its own, so that it
    has something to compute).

    Args:
        model: the served model name.
        prompt: token ids, a few KV blocks long (shorter than the engines'
            ``kv_recompute_threshold`` would be recomputed, not read).
        timeout_s: longest wait for each request, seconds.

    Raises:
        httpx.HTTPError: an engine failed or outlasted ``timeout_s``. A read back
            declined by the prefill engine (an expiring hold) is not an error: the
            handshake happened before it.
    """
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        sent = await client.post(f"{prefill_url}/v1/completions",
                                 json={**body, "kv_transfer_params": {"do_remote_decode": True,
                                                                      "do_remote_prefill": False}})
        sent.raise_for_status()
        read = await client.post(f"{decode_url}/v1/completions",
                                 json={**body, "kv_transfer_params": sent.json()["kv_transfer_params"]})
        read.raise_for_status()
        held = await client.post(f"{decode_url}/v1/completions", json={**body, "kv_transfer_params": dict(EXPORT_PARAMS)})
        held.raise_for_status()
        extra_block = prompt[: len(prompt) // 3]
        await client.post(f"{prefill_url}/v1/completions",
                          json={**body, "prompt": prompt + extra_block,
                                "kv_transfer_params": {**held.json()["kv_transfer_params"], "do_remote_decode": True}})
