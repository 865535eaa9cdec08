"""``T_kv(bytes)`` measured: one prefill-to-decode KV transfer at a time.

The prefill engine computes a fresh prompt with ``do_remote_decode`` (vLLM's
disaggregated protocol: it keeps the KV for the decode engine and replies with the
``kv_transfer_params`` that locate it); the decode engine then takes the same prompt
with those params and reads the KV. The transfer's time and size come from the
engines' ``vllm:nixl_xfer_time_seconds`` and ``vllm:nixl_bytes_transferred`` (the
reading side reports them on vLLM; a mock engine reports the transfer it simulates).
"""

from __future__ import annotations

from dataclasses import dataclass

from ampd.profile.engine import ProbedEngine
from ampd.profile.scrape import KV_BYTES, KV_XFER_TIME, ProbeError, delta, scrape, settled


@dataclass(frozen=True, slots=True)
class KvPoint:
    """One measured KV transfer.

    Attributes:
        tokens: prompt tokens whose KV moved (the prompt: fresh, nothing cached).
        bytes: bytes the engines report moved (whole KV blocks).
        time_s: the transfer's time on the engines' clocks, seconds.
    """

    tokens: int
    bytes: int
    time_s: float


async def measure_kv(prefill: ProbedEngine, decode: ProbedEngine, tokens: int,
                     settle_timeout_s: float = 120.0) -> KvPoint:
    """One transfer of a fresh ``tokens``-token prompt's KV (see the module docstring).

    Raises:
        ProbeError: the prefill engine has no KV connector (its reply carries no
            ``kv_transfer_params``), a request failed, or no transfer was reported.
    """
    prompt, session = prefill.unique_prompt(tokens), prefill.new_session()
    engines = [prefill, decode]
    before = [await scrape(e.client, e.url) for e in engines]
    reply = await prefill.complete(prompt, 1, session, {"do_remote_decode": True, "do_remote_prefill": False})
    params = reply.get("kv_transfer_params")
    if not params:
        raise ProbeError(f"{prefill.url}: no kv_transfer_params in a do_remote_decode reply: the engine has no "
                         "KV connector (vLLM: --kv-transfer-config with NixlConnector)")
    await decode.complete(prompt, 1, session, params)
    after = await settled(prefill.client, before, KV_XFER_TIME, 1, settle_timeout_s)
    moved = sum(delta(b, a, KV_BYTES).sum for b, a in zip(before, after))
    time_s = sum(delta(b, a, KV_XFER_TIME).sum for b, a in zip(before, after))
    return KvPoint(tokens, round(moved), time_s)
