"""AMPD's lazy history read on vLLM engines with bidirectional NixlConnector
(engine kind ``vllm-nixl``; AMPD.md section 3, docs/SERVING.md "The KV path on
NIXL").

A remote incremental prefill should read the session's history KV from its
decode engine when the task is dispatched, compute only the new tokens, and
send only their KV back. vLLM 0.32 does the reading itself once the prefill
request carries the decode engine's ``kv_transfer_params`` (its block ids and
NIXL address); but a decode engine returns those only in a non-streaming reply,
and rounds stream. So at dispatch time the coordinator *exports* the history:
a one-token non-streaming request to the decode engine whose prompt is the
history. The decode engine finds it in its prefix cache (it computes at most
the last partial block and one output token), holds the blocks for
``decoder_kv_blocks_ttl`` and answers with their params, which go with the
prefill request. The prefill engine pulls what its own prefix cache lacks and
frees the decode engine's hold; the decode engine then pulls only the blocks it
lacks (the new ones).

Exporting at dispatch rather than after each round keeps no blocks pinned
between rounds (a local round needs none) and never hands the prefill engine
an expired hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampd.engines.client import EngineClient, EngineError

# The body key (popped before sending) by which a queued remote prefill asks its
# dispatcher for an export.
EXPORT_KEY = "ampd_history_export"
# What a decode engine is sent so that it holds and describes a request's blocks
# when it finishes (vLLM's NixlConnector, bidirectional mode).
EXPORT_PARAMS = {"do_remote_prefill": False, "do_remote_decode": False}
# [our choice] An export is one engine step; a quarter of the round's KV deadline
# leaves the rest for the prefill itself.
EXPORT_SHARE_OF_DEADLINE = 0.25


@dataclass(frozen=True, slots=True)
class ExportRequest:
    """What a queued remote prefill asks its dispatcher to export first.

    Attributes:
        decode_url: the session's decode engine.
        history_tokens: leading prompt tokens the decode engine holds.
        history_ids: those tokens, for a prefill request that carries no prompt
            ids (a chat request: the engine renders its messages); None: the
            request's ``prompt`` starts with them.
    """

    decode_url: str
    history_tokens: int
    history_ids: list[int] | None = None

    def to_dict(self) -> dict:
        return {"decode_url": self.decode_url, "history_tokens": self.history_tokens, "history_ids": self.history_ids}

    @classmethod
    def from_dict(cls, d: dict) -> ExportRequest:
        ids = d.get("history_ids")
        return cls(str(d["decode_url"]), int(d["history_tokens"]), None if ids is None else list(ids))


def cached_tokens(reply: dict) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` of a completion reply
    (prompt tokens the engine did not compute); 0 when absent."""
    details = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


async def export_history(engines: EngineClient, body: dict, export: ExportRequest, session_id: str,
                         timeout_s: float) -> dict:
    """Ask the decode engine to hold and describe the history's blocks; put the
    prefill engine's ``kv_transfer_params`` in ``body``.

    Args:
        engines: the HTTP client.
        body: the prefill request (its ``prompt`` starts with the history,
            unless ``export.history_ids`` holds it); updated in place.
        export: where the history is and how long it is.
        session_id: for the engine's ``X-Session-Id``.
        timeout_s: longest wait for the decode engine, wall seconds.

    Returns:
        ``{"exported": bool, "decode_cached_tokens": int | None, "error": str | None}``:
        whether params were obtained, how many history tokens the decode engine
        found in its prefix cache (the rest it computed for the export), and
        why not.
    """
    history = export.history_ids if export.history_ids is not None else body["prompt"][:export.history_tokens]
    probe = {"model": body["model"], "prompt": history, "max_tokens": 1,
             "temperature": 0, "stream": False, "kv_transfer_params": dict(EXPORT_PARAMS)}
    try:
        reply = await engines.complete(export.decode_url, probe, session_id, timeout_s)
    except EngineError as err:
        return {"exported": False, "decode_cached_tokens": None, "error": f"{err.reason}: {err.message}"}
    params = reply.get("kv_transfer_params")
    if not isinstance(params, dict) or not params.get("remote_block_ids"):
        return {"exported": False, "decode_cached_tokens": cached_tokens(reply),
                "error": "the decode engine returned no kv_transfer_params (is it a bidirectional NixlConnector?)"}
    body["kv_transfer_params"] = {**params, "do_remote_decode": True, "do_remote_prefill": False}
    return {"exported": True, "decode_cached_tokens": cached_tokens(reply), "error": None}


def kv_path(history_tokens: int, export: dict | None, prefill_cached_tokens: int,
            read_min_tokens: int) -> tuple[str, str | None]:
    """Which path a remote prefill's history took, and the fallback reason if
    it was not the one intended.

    Args:
        history_tokens: the round's history, tokens.
        export: :func:`export_history`'s outcome; None when none was asked.
        prefill_cached_tokens: prompt tokens the prefill engine did not compute
            (read from the decode engine or found in its own prefix cache).
        read_min_tokens: the engines' ``kv_recompute_threshold``: a history gap
            shorter than this is recomputed by design.

    Returns:
        ``(path, reason)``: path ``"no-history"`` (first round, or a history
        too short to read), ``"history-read"`` or ``"history-recomputed"``;
        reason ``None``, ``"history-export-failed"`` (no params from the decode
        engine), ``"history-lost"`` (the decode engine held less than half of
        it: restarted or evicted, so the export recomputed it [our choice: a
        held history misses only its last partial block, whatever the block
        size]) or
        ``"history-recomputed"`` (the read was declined or failed: expired
        hold, failed handshake, dead peer).
    """
    if export is None:
        return "no-history", None
    recomputed = history_tokens - prefill_cached_tokens > max(read_min_tokens, 1)
    path = "history-recomputed" if recomputed else "history-read"
    if not export["exported"]:
        return path, "history-export-failed"
    if export["decode_cached_tokens"] < history_tokens // 2:
        return path, "history-lost"
    return path, "history-recomputed" if recomputed else None
