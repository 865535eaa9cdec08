"""The coordinator's HTTP API: OpenAI-compatible completions and chat
completions (streaming or not), ``/health``, and the admin endpoints
``/metrics`` (Prometheus) and ``/ampd/decisions`` (the decision log).
Access: ``auth.py``; request bodies: ``body.py`` and ``requests.py``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import quote

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ampd.config import ServeConfig
from ampd.core.deployment import Role
from ampd.serve.api.auth import AccessPolicy
from ampd.serve.api.body import parse_body, read_body
from ampd.serve.rounds.chat import ChatReply, stream_choice
from ampd.serve.coordinator import Coordinator
from ampd.engines.client import Chunk, EngineError, encode_json
from ampd.serve.api.requests import (check_common, check_messages, check_model, prompt_ids, round_request,
                                 template_fields)
from ampd.serve.rounds.round import RoundTrace, ServeError

_ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
                404: "NotFoundError", 409: "ConflictError", 413: "RequestTooLargeError"}


def error_response(status: int, message: str, retry_after_s: float | None = None, kind: str | None = None,
                   code: str | None = None) -> JSONResponse:
    """OpenAI's error body ``{"error": {"message", "type", "param", "code"}}``
    (``type`` and ``code`` as vLLM fills them unless given), with
    ``WWW-Authenticate`` on a 401 and ``Retry-After`` (whole seconds) when a
    retry may succeed."""
    kind = kind or _ERROR_TYPES.get(status, "BadRequestError" if status < 500 else "ServiceUnavailableError")
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    if retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(retry_after_s)))
    error = {"message": message, "type": kind, "param": None, "code": status if code is None else code}
    return JSONResponse({"error": error}, status_code=status, headers=headers)


def create_app(coordinator: Coordinator, access: AccessPolicy | None = None, limits: ServeConfig | None = None) -> FastAPI:
    """A FastAPI app serving ``coordinator``; it starts and stops with the app.

    Args:
        access: who may call what (default: open API, admin on loopback).
        limits: ``max_body_bytes`` and ``max_json_depth`` of a request body
            (``body.py``) are read from it (default: ``ServeConfig``'s defaults).
    """
    access = access or AccessPolicy({}, frozenset())
    limits = limits or ServeConfig()
    bearer = HTTPBearer(auto_error=False)
    served_models = (coordinator.options.model_name, *limits.served_model_aliases)
    session_headers = tuple(limits.session_headers)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await coordinator.start()
        yield
        await coordinator.stop()

    app = FastAPI(title="ampd coordinator", lifespan=lifespan)
    app.state.coordinator = coordinator

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, err: ServeError) -> JSONResponse:
        return error_response(err.status, str(err), err.retry_after_s, err.kind, err.code)

    async def client(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> str:
        return access.client_scope(credentials)

    async def admin(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        access.check_admin(credentials, request.client.host if request.client else None)

    async def json_body(request: Request) -> dict:
        raw = await read_body(request.stream(), request.headers.get("content-length"), limits.max_body_bytes)
        return parse_body(raw, limits.max_json_depth)

    @app.post("/v1/completions")
    async def completions(request: Request, scope: str = Depends(client)):
        body = await json_body(request)
        check_model(body, served_models)
        stream = check_common(body)
        prompt = body.get("prompt")
        ids = None if isinstance(prompt, str) else prompt_ids(prompt)
        round_req = round_request(body, request.headers, session_headers=session_headers)
        if ids is None:
            ids, tokenizer = await _tokenize(coordinator, {"prompt": prompt})
            round_req = dataclasses.replace(round_req, tokenizer_worker=tokenizer)
        return await _unless_gone(request, _serve(coordinator, dataclasses.replace(round_req, prompt=ids), scope,
                                                  stream, body))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, scope: str = Depends(client)):
        body = await json_body(request)
        check_model(body, served_models)
        stream = check_common(body)
        messages = check_messages(body.get("messages"))
        template = template_fields(body)
        round_req = round_request(body, request.headers, session_headers=session_headers, messages=messages,
                                  template=template, default_max_tokens=limits.chat_max_tokens)
        ids, tokenizer = await _tokenize(coordinator, {"messages": messages, **template})
        return await _unless_gone(request, _serve(coordinator, dataclasses.replace(round_req, prompt=ids,
                                                                                   tokenizer_worker=tokenizer),
                                                  scope, stream, body))

    @app.get("/v1/models", dependencies=[Depends(client)])
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "ampd"}
                                           for name in served_models]}

    @app.get("/health")
    async def health():
        dead = coordinator.dead_workers
        up = [i for i in coordinator.workers if i not in dead]
        status = "ok" if coordinator.store_ok else "degraded"
        return {"status": status, "store": "ok" if coordinator.store_ok else "unreachable",
                "workers_up": up, "workers_down": sorted(dead)}

    @app.get("/metrics", dependencies=[Depends(admin)])
    async def metrics():
        return Response(coordinator.metrics.exposition(), media_type="text/plain; version=0.0.4")

    @app.get("/ampd/decisions", dependencies=[Depends(admin)])
    async def decisions(kind: str | None = None, limit: int = 1000):
        rows = list(coordinator.decisions.entries) if kind is None else coordinator.decisions.of_kind(kind)
        return rows[-max(1, limit):]

    return app


async def _tokenize(coordinator: Coordinator, payload: dict) -> tuple[tuple[int, ...], int]:
    """Token ids from a live decode engine's ``/tokenize`` (text prompts, chat),
    and that engine's id."""
    dead = coordinator.dead_workers
    decode = [i for i, w in coordinator.workers.items() if w.spec.role is Role.DECODE and i not in dead]
    if not decode:
        raise ServeError(503, "no decode engine is alive to tokenize the prompt")
    worker_id = decode[0]
    try:
        ids = await coordinator.engines.tokenize(coordinator.workers[worker_id].url,
                                                 {"model": coordinator.options.model_name, **payload})
    except EngineError as err:
        if err.reason == "status" and err.status and err.status < 500:
            raise ServeError(400, f"tokenizing the prompt failed: {err.message}") from None
        raise ServeError(502, f"decode engine {worker_id} could not tokenize the prompt ({err.reason})") from None
    return prompt_ids(ids, "prompt (tokenized)"), worker_id


def _headers(trace: RoundTrace) -> dict[str, str]:
    # A session id is percent-encoded: a header carries Latin-1 only, an id may be any UTF-8.
    headers = {"X-Ampd-Decode-Worker": str(trace.decode_worker), "X-Ampd-Prefill-Worker": str(trace.prefill_worker),
               "X-Ampd-Local": str(trace.local).lower(), "X-Ampd-Round": str(trace.round_index),
               "X-Ampd-Session-Id": quote(trace.session_id, safe="")}
    if trace.fallback:
        headers["X-Ampd-Fallback"] = trace.fallback
    return headers


async def _unless_gone(request: Request, work: Awaitable[Response]) -> Response:
    """``work``'s response, unless the client leaves first: then ``work`` is
    cancelled, so its round gives back its session and KV (as a stream's does
    when its client leaves) and is counted a disconnect, instead of holding
    the session (every next round a 409) until its last token. Covers a whole
    non-streaming round and a stream's wait for its first token; the response
    for a client that left is never read (499, nginx's "client closed")."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return Response(status_code=499)
    return task.result()


async def _disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body was read: the
    server's next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _serve(coordinator: Coordinator, round_req, scope: str, stream: bool, body: dict):
    chat = round_req.chat
    trace, chunks = await coordinator.open_round(round_req, scope)
    meta = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": body.get("model") or coordinator.options.model_name}
    usage = functools.partial(_usage, coordinator, round_req, trace)
    if stream:
        include_usage = (body.get("stream_options") or {}).get("include_usage", False)
        events = _sse(chunks, meta, chat, usage if include_usage else None)
        return StreamingResponse(events, media_type="text/event-stream", headers=_headers(trace))
    if chat:
        reply = ChatReply()
        async for chunk in chunks:
            reply.add(chunk)
        choice = reply.choice(round_req.max_tokens)
    else:
        ids, texts = [], []
        async for chunk in chunks:
            ids.extend(chunk.token_ids)
            texts.append(chunk.text)
        choice = {"index": 0, "text": "".join(texts), "token_ids": ids,
                  "finish_reason": "length" if len(ids) >= round_req.max_tokens else "stop"}
    return JSONResponse({**meta, "object": "chat.completion" if chat else "text_completion", "choices": [choice],
                         "usage": usage()}, headers=_headers(trace))


def _usage(coordinator: Coordinator, round_req, trace: RoundTrace) -> dict:
    """A finished round's usage, OpenAI's shape."""
    prompt_tokens = len(round_req.prompt)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": trace.num_tokens,
            "total_tokens": prompt_tokens + trace.num_tokens,
            "prompt_tokens_details": {"cached_tokens": coordinator.cached_tokens(trace)}}


async def _sse(chunks: AsyncIterator[Chunk], meta: dict, chat: bool,
               usage: Callable[[], dict] | None) -> AsyncIterator[bytes]:
    kind = "chat.completion.chunk" if chat else "text_completion"
    first = True
    try:
        async for chunk in chunks:
            if chat:
                choice, first = stream_choice(chunk, first), False
            else:
                choice = {"index": 0, "text": chunk.text, "token_ids": list(chunk.token_ids), "finish_reason": None}
            yield _event({**meta, "object": kind, "choices": [choice]})
    except ServeError as err:
        yield _event({"error": {"message": str(err), "code": err.status}})
        return
    if usage is not None:
        yield _event({**meta, "object": kind, "choices": [], "usage": usage()})
    yield b"data: [DONE]\n\n"


def _event(payload: dict) -> bytes:
    """One SSE event (``encode_json``: json.dumps per token was a measurable part of a
    round, issue 37's profile)."""
    return b"data: " + encode_json(payload) + b"\n\n"
