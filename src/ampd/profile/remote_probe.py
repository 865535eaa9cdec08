"""A remote round measured as serving runs it on engines whose KV connector reads a
session's history from its decode engine (vLLM's bidirectional NixlConnector, engine
kind ``vllm-nixl``; docs/SERVING.md "The KV path on NIXL").

The profile's ``T_pre`` is timed on a local prefix-cache hit and ``T_kv`` on a transfer
alone; a remote round on such engines is three engine requests instead, each with its
own scheduling, and a prefill whose history arrives over the connector
(``ampd.serve.history_export``). A probe makes the three as the coordinator makes them:

1. the history on the decode engine, as after a round: its first ``hist`` tokens sent
   there with ``max_tokens=1``;
2. the export: the same tokens again with the export's ``kv_transfer_params``; the
   decode engine finds them cached and hands out their blocks;
3. the prefill: the whole prompt to the prefill engine with those params and
   ``do_remote_decode``; it reads the history (checked: its ``cached_tokens``) and
   computes the rest;
4. the join: the whole prompt to the decode engine with the prefill's params; it reads
   the new KV and computes the first token.

Each request's time is the engine's own ``vllm:time_to_first_token_seconds`` (from its
API server taking the request in to the first token leaving the engine); the serving
path around each is the profile's ``request_overhead_s``. A first round (no history)
has no export.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampd.profile.engine import ProbedEngine, cached_tokens
from ampd.profile.scrape import TIME_TO_FIRST_TOKEN, ProbeError, delta, scrape, settled
from ampd.serve.history_export import EXPORT_PARAMS

_REMOTE_DECODE = {"do_remote_decode": True, "do_remote_prefill": False}


@dataclass(frozen=True, slots=True)
class RemotePoint:
    """One measured remote round.

    Attributes:
        hist_tokens: history tokens held by the decode engine and exported.
        read_tokens: prompt tokens the prefill engine did not compute (read over the
            connector: vLLM reads whole blocks).
        new_tokens: prompt tokens the prefill engine computed.
        export_s: the decode engine's time on the export, seconds; None without history.
        prefill_s: the prefill engine's time on its request, seconds.
        join_s: the decode engine's time on the join, seconds.
    """

    hist_tokens: int
    read_tokens: int
    new_tokens: int
    export_s: float | None
    prefill_s: float
    join_s: float


async def exports_history(decode: ProbedEngine) -> bool:
    """Whether ``decode`` hands out a request's blocks for a remote prefill to read (a
    bidirectional NixlConnector): one 64-token prompt cached, then exported."""
    prompt, session = decode.unique_prompt(64), decode.new_session()
    await decode.complete(prompt, 1, session)
    params = (await decode.complete(prompt, 1, session, dict(EXPORT_PARAMS))).get("kv_transfer_params")
    return isinstance(params, dict) and bool(params.get("remote_block_ids"))


async def measure_remote(prefill: ProbedEngine, decode: ProbedEngine, hist_tokens: int, new_tokens: int,
                         settle_timeout_s: float = 60.0) -> RemotePoint:
    """One probe (see the module docstring).

    Raises:
        ProbeError: a request failed; the decode engine gave no params for the
            history (not a bidirectional NixlConnector) or the prefill engine none
            for its KV (no KV connector); or the prefill engine read less than half
            of the history (the read was refused or failed: the hold expired, the
            handshake failed).
    """
    prompt, session = decode.unique_prompt(hist_tokens + new_tokens), decode.new_session()
    params, export_s = dict(_REMOTE_DECODE), None
    if hist_tokens:
        await decode.complete(prompt[:hist_tokens], 1, session)
        before = await scrape(decode.client, decode.url)
        exported = (await decode.complete(prompt[:hist_tokens], 1, session, dict(EXPORT_PARAMS))).get(
            "kv_transfer_params")
        if not isinstance(exported, dict) or not exported.get("remote_block_ids"):
            raise ProbeError(f"{decode.url}: no kv_transfer_params for an exported history: the decode engine is "
                             "not a bidirectional NixlConnector (vLLM: bidirectional_kv_xfer)")
        export_s = await _engine_ttft_s(decode, before, settle_timeout_s)
        params = {**exported, **_REMOTE_DECODE}
    before = await scrape(prefill.client, prefill.url)
    reply = await prefill.complete(prompt, 1, session, params)
    prefill_s = await _engine_ttft_s(prefill, before, settle_timeout_s)
    read = cached_tokens(reply, prefill.url)
    if hist_tokens and read < hist_tokens // 2:
        raise ProbeError(f"{prefill.url}: read {read} of a {hist_tokens}-token history from {decode.url}: the read "
                         "was refused or failed (expired hold, failed NIXL handshake)")
    forward = reply.get("kv_transfer_params")
    if not forward:
        raise ProbeError(f"{prefill.url}: no kv_transfer_params in a do_remote_decode reply: the engine has no "
                         "KV connector (vLLM: --kv-transfer-config with NixlConnector)")
    before = await scrape(decode.client, decode.url)
    await decode.complete(prompt, 1, session, forward)
    join_s = await _engine_ttft_s(decode, before, settle_timeout_s)
    return RemotePoint(hist_tokens, read, len(prompt) - read, export_s, prefill_s, join_s)


async def _engine_ttft_s(engine: ProbedEngine, before, settle_timeout_s: float) -> float:
    (after,) = await settled(engine.client, [before], TIME_TO_FIRST_TOKEN, 1, settle_timeout_s)
    return delta(before, after, TIME_TO_FIRST_TOKEN).sum
