"""The mock engine's HTTP server: the engine API of docs/SERVING.md
(``/v1/completions``, ``/v1/chat/completions``, ``/tokenize``, ``/v1/models``,
``/health``) over one ``MockEngine``, as vLLM's OpenAI server answers it.

``GET /metrics`` reports vLLM's metric names for what the mock does, in model
seconds (``metrics.py``), so ``ampd profile`` measures a mock as a real engine.

Run: ``python -m ampd.engines.mock.server --role decode --worker-id 1 --tp 4
--server 0 --port 8101 --time-scale 0.05``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ampd.core.deployment import Role
from ampd.engines.mock.chat import tokenize_body
from ampd.engines.mock.engine import CLUSTER_DEFAULTS, DEFAULT_VOCAB_SIZE, EngineOptions, EngineRound, MockEngine
from ampd.engines.mock.requests import CompletionRequest, RequestError, parse_chat_request, parse_request
from ampd.perf.interface import PerfModel
from ampd.policy.batching import BATCHING_MODES
from ampd.sim.kv_cache import RETENTION_POLICIES

logger = logging.getLogger(__name__)

SESSION_ID_HEADER = "X-Session-Id"


LAST_ROUND_HEADER = "X-Session-Last-Round"


def _choice(token_ids: list[int], request: CompletionRequest, finish_reason: str | None,
            position: int | None = None) -> dict[str, Any]:
    """A reply's choice: a completion's text; a chat chunk's delta (the token at
    ``position`` of the plan) or, with ``position`` None, a chat reply's message."""
    ids = token_ids if request.return_token_ids else None
    plan = request.chat
    if plan is None:
        return {"index": 0, "text": "".join(f"<{t}>" for t in token_ids), "logprobs": None,
                "finish_reason": finish_reason, "stop_reason": None, "token_ids": ids}
    if position is None:
        return {"index": 0, "message": plan.message, "logprobs": None, "finish_reason": finish_reason,
                "token_ids": ids}
    return {"index": 0, "delta": plan.deltas[position], "logprobs": None, "finish_reason": finish_reason,
            "token_ids": ids}


def _finish_reason(request: CompletionRequest) -> str:
    return "length" if request.chat is None else request.chat.finish_reason


def _usage(rnd: EngineRound) -> dict[str, Any]:
    completion_tokens = len(rnd.token_ids)
    return {"prompt_tokens": rnd.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": rnd.prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": rnd.cached_tokens}}


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _stream(rnd: EngineRound, request: CompletionRequest, head: dict[str, Any]) -> AsyncIterator[str]:
    """Server-sent events: one chunk per token, the usage chunk, ``[DONE]``; a
    chat stream opens, with its first token, as vLLM's does: a role-only chunk
    carrying the rendered prompt (``prompt_token_ids``, with ``return_token_ids``).
    A client that leaves ends this generator only; the round runs on in the worker."""
    sent = 0
    while (token := await rnd.events.get()) is not None:
        if sent == 0 and request.chat is not None:
            opening = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                       "finish_reason": None}
            prompt_ids = request.prompt.tolist() if request.return_token_ids else None
            yield _event({**head, "choices": [opening], "prompt_token_ids": prompt_ids, "usage": None})
        sent += 1
        finish_reason = _finish_reason(request) if sent == len(rnd.token_ids) else None
        yield _event({**head, "choices": [_choice([token], request, finish_reason, sent - 1)], "usage": None})
    if request.include_usage:
        yield _event({**head, "choices": [], "usage": _usage(rnd)})
    yield "data: [DONE]\n\n"


async def _reply(rnd: EngineRound, request: CompletionRequest, head: dict[str, Any]) -> dict[str, Any]:
    """The non-streaming reply, once the round has ended."""
    token_ids = []
    while (token := await rnd.events.get()) is not None:
        token_ids.append(token)
    reply = {**head, "choices": [_choice(token_ids, request, _finish_reason(request))], "usage": _usage(rnd)}
    if request.chat is not None and request.return_token_ids:
        reply["prompt_token_ids"] = request.prompt.tolist()
    if rnd.kv_transfer_params is not None:
        reply["kv_transfer_params"] = rnd.kv_transfer_params
    return reply


def create_app(options: EngineOptions, perf: PerfModel | None = None) -> FastAPI:
    """The mock engine's HTTP app; ``app.state.engine`` is its ``MockEngine``.

    Raises:
        InputError: see ``MockEngine``.
    """
    engine = MockEngine(options, perf)
    app = FastAPI(title=f"ampd mock {options.role.name.lower()} engine {options.worker_id}")
    app.state.engine = engine
    request_ids = itertools.count()

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(engine.metrics.exposition(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": options.model, "object": "model", "owned_by": "ampd-mock",
                                            "max_model_len": engine.capacity_tokens}]}

    @app.post("/tokenize")
    async def tokenize(http: Request) -> Response:
        try:
            return JSONResponse(tokenize_body(json.loads(await http.body()), options.vocab_size))
        except ValueError as exc:
            return RequestError(400, f"body: {exc}", "body").response()

    async def serve(http: Request, chat: bool) -> Response:
        try:
            body = json.loads(await http.body())
        except ValueError:
            return RequestError(400, "body: not valid JSON", "body").response()
        session_id = http.headers.get(SESSION_ID_HEADER, "")
        try:
            request = (parse_chat_request(body, options.model, options.vocab_size) if chat
                       else parse_request(body, options.model, options.vocab_size))
            if options.api_delay_s:
                await asyncio.sleep(options.api_delay_s * options.time_scale)
            last_round = http.headers.get(LAST_ROUND_HEADER, "").lower() == "true"
            rnd = engine.submit(request, session_id, last_round)
        except RequestError as exc:
            logger.debug("worker %d refused a request: %d %s", options.worker_id, exc.status, exc.message)
            return exc.response()
        kind = ("chat.completion.chunk" if request.stream else "chat.completion") if chat else "text_completion"
        head = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{options.worker_id}-{next(request_ids)}", "object": kind,
                "created": int(time.time()), "model": options.model}
        if request.stream:
            return StreamingResponse(_stream(rnd, request, head), media_type="text/event-stream")
        return JSONResponse(await _reply(rnd, request, head))

    @app.post("/v1/completions")
    async def completions(http: Request) -> Response:
        return await serve(http, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: Request) -> Response:
        return await serve(http, chat=True)

    return app


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ampd.engines.mock.server", description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=("prefill", "decode"), required=True)
    p.add_argument("--worker-id", type=int, required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--server", type=int, default=0, help="server index (KV transfer times)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model", default=CLUSTER_DEFAULTS.model)
    p.add_argument("--gpu", default=CLUSTER_DEFAULTS.gpu)
    p.add_argument("--network-gb-per-s", type=float, default=CLUSTER_DEFAULTS.network_gb_per_s, help="between servers")
    p.add_argument("--nvlink-gb-per-s", type=float, default=None, help="per GPU; default: the GPU's datasheet")
    p.add_argument("--perf-model", help="perf model file timing the engine (--model and --gpu: its names)")
    p.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per model second")
    p.add_argument("--kv-fail-rate", type=float, default=0.0, help="probability a remote prefill's KV fails to load")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--batching", choices=BATCHING_MODES, default="alternate")
    p.add_argument("--chunk-tokens", type=int, default=2048)
    p.add_argument("--kv-retention", choices=RETENTION_POLICIES, default="resident")
    p.add_argument("--pin-ttl-s", type=float, default=0.0)
    p.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    p.add_argument("--api-delay-s", type=float, default=0.0,
                   help="model seconds each request waits before the engine takes it in")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one mock engine until interrupted; 2 on a bad option."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    try:
        fields = {k: v for k, v in vars(args).items() if k not in ("role", "port", "host", "log_level")}
        app = create_app(EngineOptions(role=Role.PREFILL if args.role == "prefill" else Role.DECODE, **fields))
    except ValueError as exc:
        print(f"mock engine: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
