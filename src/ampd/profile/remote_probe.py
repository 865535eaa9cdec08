"""A remote round measured as serving runs it on engines whose KV connector reads a
session's history from its decode engine (vLLM's bidirectional NixlConnector, engine
kind ``vllm-nixl``; docs/SERVING.md "The KV path on NIXL").

The profile's ``T_pre`` is timed on a local prefix-cache hit and ``T_kv`` on a transfer
alone; a remote round on such engines is three engine requests instead, each with its
own scheduling, and a prefill whose history arrives over the connector
(``ampd.engines.history_export``). A probe makes the three as the coordinator makes them:

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
API server taking the request in to the first token leaving the engine); its serving
path, the client's time from sending it to its reply (the one token) less that: a plain
request's (``ampd.profile.overhead_probe``) need not be a remote round's, whose requests
carry the connector's parameters and meet engines busy as serving keeps them. A first
round (no history) has no export.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from ampd.profile.engine import ProbedEngine, cached_tokens
from ampd.profile.scrape import TIME_SCALE, TIME_TO_FIRST_TOKEN, ProbeError, delta, scrape, settled
from ampd.engines.history_export import EXPORT_PARAMS

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
        export_path_s, prefill_path_s, join_path_s: each request's serving path (the
            client's time less the engine's), seconds; the export's None without history.
    """

    hist_tokens: int
    read_tokens: int
    new_tokens: int
    export_s: float | None
    prefill_s: float
    join_s: float
    export_path_s: float | None
    prefill_path_s: float
    join_path_s: float


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
    params, export = dict(_REMOTE_DECODE), (None, None)
    if hist_tokens:
        await decode.complete(prompt[:hist_tokens], 1, session)
        reply, export = await _timed(decode, settle_timeout_s, decode.complete(prompt[:hist_tokens], 1, session,
                                                                               dict(EXPORT_PARAMS)))
        exported = reply.get("kv_transfer_params")
        if not isinstance(exported, dict) or not exported.get("remote_block_ids"):
            raise ProbeError(f"{decode.url}: no kv_transfer_params for an exported history: the decode engine is "
                             "not a bidirectional NixlConnector (vLLM: bidirectional_kv_xfer)")
        params = {**exported, **_REMOTE_DECODE}
    reply, prefilled = await _timed(prefill, settle_timeout_s, prefill.complete(prompt, 1, session, params))
    read = cached_tokens(reply, prefill.url)
    if hist_tokens and read < hist_tokens // 2:
        raise ProbeError(f"{prefill.url}: read {read} of a {hist_tokens}-token history from {decode.url}: the read "
                         "was refused or failed (expired hold, failed NIXL handshake)")
    forward = reply.get("kv_transfer_params")
    if not forward:
        raise ProbeError(f"{prefill.url}: no kv_transfer_params in a do_remote_decode reply: the engine has no "
                         "KV connector (vLLM: --kv-transfer-config with NixlConnector)")
    _, joined = await _timed(decode, settle_timeout_s, decode.complete(prompt, 1, session, forward))
    return RemotePoint(hist_tokens, read, len(prompt) - read, export[0], prefilled[0], joined[0], export[1],
                       prefilled[1], joined[1])


async def _timed(engine: ProbedEngine, settle_timeout_s: float,
                 request: Awaitable[dict[str, Any]]) -> tuple[dict[str, Any], tuple[float, float]]:
    """``request`` made on ``engine``: its reply and ``(engine_ttft_s, serving_path_s)``,
    the client's time turned into the engine's seconds (a mock engine's scaled clock)."""
    before = await scrape(engine.client, engine.url)
    sent_s = time.perf_counter()
    reply = await request
    client_s = time.perf_counter() - sent_s
    (after,) = await settled(engine.client, [before], TIME_TO_FIRST_TOKEN, 1, settle_timeout_s)
    engine_s = delta(before, after, TIME_TO_FIRST_TOKEN).sum
    return reply, (engine_s, client_s / (after.value(TIME_SCALE) or 1.0) - engine_s)
