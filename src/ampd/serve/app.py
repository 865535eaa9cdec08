"""The coordinator's HTTP API: OpenAI-compatible completions and chat
completions (streaming or not), ``/health``, ``/metrics`` (Prometheus),
``/ampd/decisions`` (the decision log)."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ampd.core.deployment import Role
from ampd.serve.coordinator import Coordinator
from ampd.serve.engine_client import Chunk, EngineError
from ampd.serve.requests import check_common, check_messages, prompt_ids, round_request
from ampd.serve.rounds import RoundTrace, ServeError


def error_response(status: int, message: str) -> JSONResponse:
    """vLLM's (and OpenAI's) error shape."""
    kind = "BadRequestError" if status < 500 else "ServiceUnavailableError"
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def create_app(coordinator: Coordinator) -> FastAPI:
    """A FastAPI app serving ``coordinator``; it starts and stops with the app."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await coordinator.start()
        yield
        await coordinator.stop()

    app = FastAPI(title="ampd coordinator", lifespan=lifespan)

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, err: ServeError) -> JSONResponse:
        return error_response(err.status, str(err))

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _json_body(request)
        stream = check_common(body)
        prompt = body.get("prompt")
        ids = await _tokenize(coordinator, {"prompt": prompt}) if isinstance(prompt, str) else prompt_ids(prompt)
        return await _serve(coordinator, round_request(body, request.headers, ids), stream, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await _json_body(request)
        stream = check_common(body)
        messages = check_messages(body.get("messages"))
        ids = await _tokenize(coordinator, {"messages": messages, "add_generation_prompt": True})
        return await _serve(coordinator, round_request(body, request.headers, ids), stream, body, chat=True)

    @app.get("/health")
    async def health():
        dead = coordinator.dead_workers
        up = [i for i in coordinator.workers if i not in dead]
        status = "ok" if coordinator.store_ok else "degraded"
        return {"status": status, "store": "ok" if coordinator.store_ok else "unreachable",
                "workers_up": up, "workers_down": sorted(dead)}

    @app.get("/metrics")
    async def metrics():
        return Response(coordinator.metrics.exposition(), media_type="text/plain; version=0.0.4")

    @app.get("/ampd/decisions")
    async def decisions(kind: str | None = None, limit: int = 1000):
        rows = list(coordinator.decisions.entries) if kind is None else coordinator.decisions.of_kind(kind)
        return rows[-max(1, limit):]

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": coordinator.options.model_name, "object": "model"}]}

    return app


async def _json_body(request: Request) -> dict:
    try:
        body = json.loads(await request.body())
    except (ValueError, UnicodeDecodeError) as err:
        raise ServeError(400, f"request body: not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise ServeError(400, "request body: expected a JSON object")
    return body


async def _tokenize(coordinator: Coordinator, payload: dict) -> tuple[int, ...]:
    """Token ids from a live decode engine's ``/tokenize`` (text prompts, chat)."""
    dead = coordinator.dead_workers
    decode = [w for i, w in coordinator.workers.items() if w.spec.role is Role.DECODE and i not in dead]
    if not decode:
        raise ServeError(503, "no decode engine is alive to tokenize the prompt")
    try:
        ids = await coordinator.engines.tokenize(decode[0].url, {"model": coordinator.options.model_name, **payload})
    except EngineError as err:
        status = 400 if err.reason == "status" and err.status and err.status < 500 else 502
        raise ServeError(status, f"tokenizing the prompt failed: {err.message}") from None
    return prompt_ids(ids, "prompt (tokenized)")


def _headers(trace: RoundTrace) -> dict[str, str]:
    headers = {"X-Ampd-Decode-Worker": str(trace.decode_worker), "X-Ampd-Prefill-Worker": str(trace.prefill_worker),
               "X-Ampd-Local": str(trace.local).lower(), "X-Ampd-Round": str(trace.round_index)}
    if trace.fallback:
        headers["X-Ampd-Fallback"] = trace.fallback
    return headers


async def _serve(coordinator: Coordinator, round_req, stream: bool, body: dict, chat: bool):
    trace, chunks = await coordinator.open_round(round_req)
    meta = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", "created": int(time.time()),
            "model": body.get("model") or coordinator.options.model_name}
    if stream:
        usage = (body.get("stream_options") or {}).get("include_usage", False)
        events = _sse(chunks, meta, chat, round_req, trace, usage)
        return StreamingResponse(events, media_type="text/event-stream", headers=_headers(trace))
    ids, texts = [], []
    async for chunk in chunks:
        ids.extend(chunk.token_ids)
        texts.append(chunk.text)
    choice = ({"index": 0, "message": {"role": "assistant", "content": "".join(texts)}} if chat
              else {"index": 0, "text": "".join(texts)})
    choice.update(token_ids=ids, finish_reason="length" if len(ids) >= round_req.max_tokens else "stop")
    return JSONResponse({**meta, "object": "chat.completion" if chat else "text_completion", "choices": [choice],
                         "usage": _usage(round_req, trace)}, headers=_headers(trace))


def _usage(round_req, trace: RoundTrace) -> dict:
    prompt_tokens = len(round_req.prompt)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": trace.num_tokens,
            "total_tokens": prompt_tokens + trace.num_tokens}


async def _sse(chunks: AsyncIterator[Chunk], meta: dict, chat: bool, round_req, trace: RoundTrace,
               include_usage: bool) -> AsyncIterator[str]:
    kind = "chat.completion.chunk" if chat else "text_completion"
    try:
        async for chunk in chunks:
            choice = ({"index": 0, "delta": {"content": chunk.text}} if chat else {"index": 0, "text": chunk.text})
            choice.update(token_ids=list(chunk.token_ids), finish_reason=None)
            yield f"data: {json.dumps({**meta, 'object': kind, 'choices': [choice]})}\n\n"
    except ServeError as err:
        yield f"data: {json.dumps({'error': {'message': str(err), 'code': err.status}})}\n\n"
        return
    if include_usage:
        yield f"data: {json.dumps({**meta, 'object': kind, 'choices': [], 'usage': _usage(round_req, trace)})}\n\n"
    yield "data: [DONE]\n\n"
