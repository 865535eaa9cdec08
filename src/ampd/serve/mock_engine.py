"""The mock engine: one simulated worker (prefill or decode role) behind the
engine API of docs/SERVING.md, in real time.

The worker is the simulator's own model (``SimPrefillWorker`` or
``SimDecodeWorker``, timed by the simulator's performance model) on a
``WallClockLoop``, so a mock engine's latencies are the simulator's.

Output tokens are ``token_id(session, prompt length, position)``: the same ids
on every engine, whatever path (local or remote prefill) a round takes.

Decode role: the engine remembers, per ``X-Session-Id``, the ids its KV holds
(the last prompt and the output generated for it); a request's cached prefix is
the longest common prefix with them (vLLM's prefix-cache hit; at most the
prompt's length minus one, as vLLM recomputes the last prompt token). A request
without ``kv_transfer_params`` prefills the rest locally; one with
``do_remote_prefill`` carries its KV and joins the batch at once. A request
with ``X-Session-Last-Round: true`` frees the session's KV when it ends. A
request without ``X-Session-Id`` belongs to the session ``""``.

Prefill role: a ``max_tokens: 1`` request with ``do_remote_decode`` and the
AMPD keys (``ampd_hist_tokens``, ``ampd_decode_tp``, ``ampd_decode_server``;
without them: no history, a decode engine of the same TP on the same server)
reads its history from that decode worker, prefills the rest and sends the new
KV back; the reply comes when the KV has arrived, with the ``kv_transfer_params``
the decode engine takes. A ``max_tokens: 1`` request without
``kv_transfer_params`` is a plain prefill, as a vLLM engine with a KV connector
also serves one: no history, nothing sent, no ``kv_transfer_params`` in the reply.

``GET /metrics`` reports vLLM's metric names for what the mock does, in model
seconds (``mock_metrics``), so ``ampd profile`` measures a mock as a real engine.

Run: ``python -m ampd.serve.mock_engine --role decode --worker-id 1 --tp 4
--server 0 --port 8101 --time-scale 0.05``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import logging
import math
import random
import sys
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ampd.config import ClusterConfig, RunConfig
from ampd.core.deployment import Role, WorkerSpec
from ampd.core.errors import InputError
from ampd.core.task import PrefillTask
from ampd.experiment import perf_model_for, require_tp
from ampd.metrics.records import ItlSeries
from ampd.perf.interface import PerfModel, RemoteStages
from ampd.policy.batching import BATCHING_MODES, Batching
from ampd.policy.reorder import Fcfs
from ampd.serve.clock import ScaledClock
from ampd.serve.mock_chat import ChatReplyPlan, ChatRequestError, plan_reply, render_chat, tokenize_body, tokenize_text
from ampd.serve.mock_metrics import MockEngineMetrics
from ampd.serve.wallclock_loop import WallClockLoop
from ampd.sim.decode_worker import SimDecodeWorker
from ampd.sim.kv_cache import RETENTION_POLICIES, SessionKvCache
from ampd.sim.prefill_worker import SimPrefillWorker

logger = logging.getLogger(__name__)

SESSION_ID_HEADER = "X-Session-Id"
LAST_ROUND_HEADER = "X-Session-Last-Round"
DEFAULT_VOCAB_SIZE = 32_000
_DEFAULTS = ClusterConfig()
_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}


def token_id(session_id: str, prompt_tokens: int, position: int, vocab_size: int = DEFAULT_VOCAB_SIZE) -> int:
    """Output token ``position`` (0-based) of the round of ``session_id`` whose
    prompt is ``prompt_tokens`` long: a hash, in ``[0, vocab_size)``."""
    key = f"{session_id}\x00{prompt_tokens}\x00{position}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") % vocab_size


def engine_perf_model(model: str, gpu: str, network_gb_per_s: float = _DEFAULTS.network_gb_per_s,
                      nvlink_gb_per_s: float | None = None, perf_model: str | None = None) -> PerfModel:
    """The simulator's performance model of ``model`` on ``gpu`` with these links
    (``ClusterConfig``'s fields of the same names), or the one in the file
    ``perf_model`` (``ClusterConfig.perf_model``: ``model`` and ``gpu`` must then be
    the file's names), exactly as a simulation of that configuration gets it.

    Raises:
        InputError: unknown model or GPU name; an unreadable perf model file, or one
            of another model or GPU.
        pydantic.ValidationError (a ValueError): a bandwidth <= 0.
    """
    cluster = ClusterConfig(model=model, gpu=gpu, network_gb_per_s=network_gb_per_s, nvlink_gb_per_s=nvlink_gb_per_s,
                            perf_model=perf_model)
    return perf_model_for(RunConfig(cluster=cluster))


@dataclass(frozen=True)
class EngineOptions:
    """Which worker a mock engine is and how it behaves.

    Attributes:
        role, worker_id, tp, server: the worker's ``WorkerSpec``.
        model, gpu: catalog names of the performance model; ``model`` is also the
            served model name.
        perf_model: a perf model file that times the engine instead of the catalog's
            (``engine_perf_model``); None: the catalog's.
        network_gb_per_s, nvlink_gb_per_s: the links of the performance model (KV
            transfer times), as in ``ClusterConfig``.
        time_scale: wall seconds per model second (``ScaledClock``).
        kv_fail_rate: probability that a decode engine fails to load a remote
            prefill's KV (HTTP 503), drawn from ``random.Random(seed)``.
        window_s: window of the worker's TTFT / ITL statistics, model seconds.
        batching, chunk_tokens: the decode worker's ``Batching``.
        kv_retention, pin_ttl_s: the decode worker's ``SessionKvCache`` policy.
        vocab_size: prompt ids must be below it; output ids are.
        api_delay_s: model seconds every completion request waits before the engine
            takes it in (outside its TTFT counter): a known serving path, as a
            real engine's API server adds one (``ampd.profile.overhead_probe``).

    Raises:
        ValueError: an id, degree or rate out of range (the message names it).
    """

    role: Role
    worker_id: int
    tp: int
    server: int = 0
    model: str = _DEFAULTS.model
    gpu: str = _DEFAULTS.gpu
    network_gb_per_s: float = _DEFAULTS.network_gb_per_s
    nvlink_gb_per_s: float | None = None
    perf_model: str | None = None
    time_scale: float = 1.0
    kv_fail_rate: float = 0.0
    seed: int = 0
    window_s: float = 10.0
    batching: str = "alternate"
    chunk_tokens: int = 2048
    kv_retention: str = "resident"
    pin_ttl_s: float = 0.0
    vocab_size: int = DEFAULT_VOCAB_SIZE
    api_delay_s: float = 0.0

    def __post_init__(self) -> None:
        for name, low in (("worker_id", 0), ("tp", 1), ("server", 0), ("vocab_size", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name} must be >= {low}, got {getattr(self, name)}")
        if not 0.0 <= self.kv_fail_rate <= 1.0:
            raise ValueError(f"kv_fail_rate must be in [0, 1], got {self.kv_fail_rate}")
        if not (math.isfinite(self.api_delay_s) and self.api_delay_s >= 0.0):
            raise ValueError(f"api_delay_s (--api-delay-s) must be a finite number >= 0, got {self.api_delay_s}")


class RequestError(Exception):
    """A request the engine refuses: HTTP ``status`` with vLLM's error body;
    ``param`` names the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": _ERROR_TYPES.get(self.status, "Error"),
                 "param": self.param, "code": self.status}
        return JSONResponse({"error": error}, status_code=self.status)


@dataclass(frozen=True)
class CompletionRequest:
    """The fields of ``POST /v1/completions`` (or of a chat request, rendered:
    ``parse_chat_request``) the mock uses.

    Attributes:
        output_ids: the reply's token ids when the request decides them (a
            chat reply, ``mock_chat.plan_reply``); None: ``token_id``'s hashes.
        chat: the chat reply's plan, None for a completion.
    """

    prompt: np.ndarray
    max_tokens: int
    stream: bool
    include_usage: bool
    return_token_ids: bool
    kv_transfer_params: dict[str, Any]
    output_ids: tuple[int, ...] | None = None
    chat: ChatReplyPlan | None = None


def _field(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RequestError(400, f"{name}: expected {kind.__name__}, got {type(value).__name__}", name)
    return value


def _prompt(value: Any, vocab_size: int) -> np.ndarray:
    message = f"prompt: must be a non-empty list of token ids in [0, {vocab_size}) (the mock takes no text)"
    if not isinstance(value, list) or not value:
        raise RequestError(400, message, "prompt")
    try:
        ids = np.asarray(value)
    except (ValueError, OverflowError):
        raise RequestError(400, message, "prompt") from None
    if ids.ndim != 1 or ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= vocab_size:
        raise RequestError(400, message, "prompt")
    return ids.astype(np.int32)


def parse_request(body: Any, model: str, vocab_size: int) -> CompletionRequest:
    """Validate a completion request body.

    Raises:
        RequestError: 404 for another model; 400 naming the field for a text
            prompt, an id out of the vocabulary, or a field of the wrong type or range.
    """
    if not isinstance(body, dict):
        raise RequestError(400, "body: expected a JSON object", "body")
    if body.get("model", model) != model:
        raise RequestError(404, f"The model `{body['model']}` does not exist.", "model")
    prompt = _prompt(body.get("prompt"), vocab_size)
    max_tokens = _field(body, "max_tokens", int, 16)
    if max_tokens < 1:
        raise RequestError(400, f"max_tokens: must be >= 1, got {max_tokens}", "max_tokens")
    stream_options = _field(body, "stream_options", dict, {})
    return CompletionRequest(prompt, max_tokens, _field(body, "stream", bool, False),
                             bool(stream_options.get("include_usage")), _field(body, "return_token_ids", bool, False),
                             _field(body, "kv_transfer_params", dict, {}))


def parse_chat_request(body: Any, model: str, vocab_size: int) -> CompletionRequest:
    """Validate a chat request body and plan its reply (``mock_chat``).

    Raises:
        RequestError: 404 for another model; 400 naming the field for missing
            messages, a field of the wrong type or range, a ``tool_choice`` or
            ``response_format`` the mock cannot honour.
    """
    if not isinstance(body, dict):
        raise RequestError(400, "body: expected a JSON object", "body")
    if body.get("model", model) != model:
        raise RequestError(404, f"The model `{body['model']}` does not exist.", "model")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise RequestError(400, "messages: must be a non-empty list", "messages")
    max_tokens = _field(body, "max_completion_tokens", int, _field(body, "max_tokens", int, 16))
    if max_tokens < 1:
        raise RequestError(400, f"max_tokens: must be >= 1, got {max_tokens}", "max_tokens")
    try:
        prompt = tokenize_text(render_chat(body), vocab_size)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a message of another shape
        raise RequestError(400, f"messages: cannot be rendered ({type(exc).__name__}: {exc})", "messages") from None
    try:
        plan = plan_reply(body, prompt, max_tokens)
    except ChatRequestError as exc:
        raise RequestError(400, str(exc), exc.param) from None
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a field of another shape
        raise RequestError(400, f"tools, tool_choice or response_format: malformed ({type(exc).__name__}: {exc})",
                           "tools") from None
    output_ids = tuple(tokenize_text(plan.text, vocab_size))
    stream_options = _field(body, "stream_options", dict, {})
    return CompletionRequest(np.asarray(prompt, dtype=np.int32), len(output_ids), _field(body, "stream", bool, False),
                             bool(stream_options.get("include_usage")), _field(body, "return_token_ids", bool, False),
                             _field(body, "kv_transfer_params", dict, {}), output_ids, plan)


def _int_param(params: dict[str, Any], name: str, low: int, high: int | None = None,
               default: int | None = None) -> int:
    value = params.get(name, default)
    if type(value) is not int or value < low or (high is not None and value > high):
        bounds = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise RequestError(400, f"kv_transfer_params.{name}: expected an integer {bounds}, got {value!r}",
                           f"kv_transfer_params.{name}")
    return value


@dataclass(eq=False)
class EngineRound:
    """One request inside the engine. ``events`` receives each output token id as
    the worker emits it, then None when the round ends.

    Attributes:
        token_ids: every output token of the round, in order.
        cached_tokens: prompt tokens whose KV the engine did not compute.
        kv_transfer_params: what the reply carries (prefill role), else None.
        last_round: free the session's KV when the round ends.
        submit_s, first_token_s, last_token_s: when it arrived, when its first token
            was out and its last so far, model seconds (the engine's metrics).
        kv_send_s: a prefill role's KV transfer to its decode engine, model seconds.
    """

    session_id: str
    prompt_tokens: int
    token_ids: list[int]
    cached_tokens: int
    kv_transfer_params: dict[str, Any] | None = None
    last_round: bool = False
    events: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    num_emitted: int = 0
    submit_s: float = 0.0
    first_token_s: float = 0.0
    last_token_s: float = 0.0
    kv_send_s: float = 0.0

    def emit(self) -> None:
        """The worker produced the next token."""
        self.events.put_nowait(self.token_ids[self.num_emitted])
        self.num_emitted += 1


class MockEngine:
    """The worker model and the rounds it serves; the ``RoundSink`` of its worker.

    Attributes:
        rounds: rounds started and not ended, by ``PrefillTask.key`` (the round
            index is the engine's request counter). A round whose client left
            stays until the worker has produced its last token.

    Raises:
        InputError: the model's weights do not fit in ``tp`` GPUs, a ``tp`` the
            performance model has no cost functions for, or an unknown model or GPU
            name.
    """

    def __init__(self, options: EngineOptions, perf: PerfModel | None = None) -> None:
        self.options = options
        self.perf = perf or engine_perf_model(options.model, options.gpu, options.network_gb_per_s,
                                              options.nvlink_gb_per_s, options.perf_model)
        require_tp(self.perf, options.tp, "mock engine")
        self.spec = WorkerSpec(options.worker_id, options.role, options.tp, options.server)
        self.capacity_tokens = self.perf.kv_capacity_tokens(options.tp)
        if self.capacity_tokens <= 0:
            raise InputError(f"{options.model} does not fit in {options.tp} {options.gpu} GPU(s) with room for KV cache")
        self.loop = WallClockLoop(ScaledClock(options.time_scale))
        self.rounds: dict[tuple[str, int], EngineRound] = {}
        self._held: dict[str, np.ndarray] = {}
        self._decode_specs: dict[int, WorkerSpec] = {}
        self.worker = self._make_worker()
        self.metrics = MockEngineMetrics(self.capacity_tokens, options.time_scale)
        self._ids = itertools.count()
        self._fail_rng = random.Random(options.seed)

    def _make_worker(self) -> SimPrefillWorker | SimDecodeWorker:
        o = self.options
        if o.role is Role.PREFILL:
            return SimPrefillWorker(self.spec, self.loop, self.perf, Fcfs(), self, o.window_s,
                                    self._decode_specs.__getitem__)
        kv = SessionKvCache(self.capacity_tokens, o.kv_retention, o.pin_ttl_s)
        return SimDecodeWorker(self.spec, self.loop, self.perf, Fcfs(), self, o.window_s,
                               Batching(o.batching, o.chunk_tokens), kv, self._tokens)

    def submit(self, request: CompletionRequest, session_id: str, last_round: bool = False) -> EngineRound:
        """Start serving ``request``; its tokens arrive on the returned round's ``events``.

        Raises:
            RequestError: 400 for a request this role cannot serve or too long for
                the KV cache; 503 for a remote prefill whose KV fails to load.
        """
        return self.loop.run_now(self._submit, request, session_id, last_round)

    def _submit(self, request: CompletionRequest, session_id: str, last_round: bool) -> EngineRound:
        total_tokens = len(request.prompt) + request.max_tokens
        if total_tokens > self.capacity_tokens:
            raise RequestError(400, f"max_tokens: prompt + max_tokens = {total_tokens} tokens exceed the "
                                    f"{self.capacity_tokens} tokens of KV cache", "max_tokens")
        params = request.kv_transfer_params
        if self.spec.role is Role.PREFILL:
            return self._submit_prefill(request, session_id, params)
        if params.get("do_remote_decode"):
            raise RequestError(400, "kv_transfer_params.do_remote_decode: this is a decode engine",
                               "kv_transfer_params.do_remote_decode")
        if params.get("do_remote_prefill"):
            return self._submit_remote(request, session_id, params, last_round)
        rnd, task = self._start_decode(request, session_id, last_round)
        self.worker.enqueue_local(task)
        self._log("local", rnd)
        return rnd

    def _prefix_hit(self, session_id: str, prompt: np.ndarray) -> int:
        """Prompt tokens the session's KV holds already (see the module docstring)."""
        held = self._held.get(session_id)
        if held is None:
            return 0
        n = min(len(held), len(prompt) - 1)
        diff = np.flatnonzero(held[:n] != prompt[:n])
        return int(diff[0]) if diff.size else n

    def _start_decode(self, request: CompletionRequest, session_id: str,
                      last_round: bool) -> tuple[EngineRound, PrefillTask]:
        """Start a round on the decode worker: its KV cache (which may have evicted
        part of the hit) and the ids it holds once the round is over."""
        prompt = request.prompt
        hit = self._prefix_hit(session_id, prompt)
        cached = self.worker.kv.begin_round(session_id, hit, len(prompt) - hit + request.max_tokens, self.loop.now_s)
        rnd, task = self._start(request, session_id, cached, self.spec.worker_id)
        rnd.last_round = last_round
        self._held[session_id] = np.concatenate([prompt, np.asarray(rnd.token_ids, dtype=np.int32)])
        return rnd, task

    def _start(self, request: CompletionRequest, session_id: str, cached_tokens: int,
               decode_worker: int) -> tuple[EngineRound, PrefillTask]:
        n = len(request.prompt)
        task = PrefillTask(session_id, next(self._ids), cached_tokens, n - cached_tokens, self.loop.now_s,
                           decode_worker)
        outputs = (list(request.output_ids) if request.output_ids is not None
                   else [token_id(session_id, n, i, self.options.vocab_size) for i in range(request.max_tokens)])
        rnd = EngineRound(session_id, n, outputs, cached_tokens, submit_s=self.loop.now_s)
        self.rounds[task.key] = rnd
        return rnd, task

    def _submit_remote(self, request: CompletionRequest, session_id: str, params: dict[str, Any],
                       last_round: bool) -> EngineRound:
        prompt_tokens = params.get("ampd_prompt_tokens", len(request.prompt))
        if prompt_tokens != len(request.prompt):
            raise RequestError(400, f"kv_transfer_params.ampd_prompt_tokens: the KV is of {prompt_tokens} tokens, "
                                    f"the prompt of {len(request.prompt)}", "kv_transfer_params.ampd_prompt_tokens")
        rate = self.options.kv_fail_rate
        if rate > 0 and self._fail_rng.random() < rate:
            raise RequestError(503, f"KV transfer failed (injected, kv_fail_rate={rate}): recompute locally")
        rnd, task = self._start_decode(request, session_id, last_round)
        self._log("remote", rnd)
        self.first_token(task, params.get("ampd_prefill_worker", -1), False)
        return rnd

    def _submit_prefill(self, request: CompletionRequest, session_id: str, params: dict[str, Any]) -> EngineRound:
        if request.max_tokens != 1 or request.stream:
            name = "max_tokens" if request.max_tokens != 1 else "stream"
            raise RequestError(400, f"{name}: a prefill engine takes max_tokens 1, stream false", name)
        if not params:
            return self._submit_plain_prefill(request, session_id)
        if params.get("do_remote_decode") is not True:
            raise RequestError(400, "kv_transfer_params.do_remote_decode: must be true on a prefill engine",
                               "kv_transfer_params.do_remote_decode")
        # Without AMPD's keys it is vLLM's plain disaggregated request: no history, and
        # a decode engine like this one on its server.
        hist_tokens = _int_param(params, "ampd_hist_tokens", 0, len(request.prompt) - 1, default=0)
        decode_spec = WorkerSpec(-1, Role.DECODE, _int_param(params, "ampd_decode_tp", 1, default=self.spec.tp),
                                 _int_param(params, "ampd_decode_server", 0, default=self.spec.server))
        spec_key = next(self._ids)
        self._decode_specs[spec_key] = decode_spec
        rnd, task = self._start(request, session_id, hist_tokens, spec_key)
        new_tokens = rnd.prompt_tokens - hist_tokens
        # The worker times the send by the same stage; the counter is the transfer's.
        rnd.kv_send_s = self.perf.remote_stages_s(hist_tokens, new_tokens, self.spec, decode_spec).send_s
        self.metrics.kv_xfer_time_s.observe(self.perf.kv_transfer_s(new_tokens, self.spec, decode_spec))
        self.metrics.kv_bytes.observe(new_tokens * self.perf.kv_bytes_per_token)
        rnd.kv_transfer_params = {"do_remote_prefill": True, "do_remote_decode": False,
                                  "ampd_prefill_worker": self.spec.worker_id, "ampd_prompt_tokens": rnd.prompt_tokens}
        self.worker.enqueue(task)
        self._log("prefill", rnd)
        return rnd

    def _submit_plain_prefill(self, request: CompletionRequest, session_id: str) -> EngineRound:
        """A prefill whose KV goes nowhere: ``T_pre`` of the prompt, no read, no send (not a
        remote round's stages, which a measured remote path would time as three requests)."""
        spec_key = next(self._ids)
        self._decode_specs[spec_key] = self.spec
        rnd, task = self._start(request, session_id, 0, spec_key)
        self.worker.enqueue(task, RemoteStages(0.0, self.perf.prefill_s(0, task.new_tokens, self.spec.tp), 0.0))
        self._log("plain prefill", rnd)
        return rnd

    def _log(self, path: str, rnd: EngineRound) -> None:
        logger.debug("worker %d %s: session %s prompt %d cached %d max_tokens %d", self.spec.worker_id, path,
                     rnd.session_id, rnd.prompt_tokens, rnd.cached_tokens, len(rnd.token_ids))

    def first_token(self, task: PrefillTask, prefill_worker: int, local: bool) -> None:
        """Sink: the round's first token is out (its KV is on the decode side)."""
        rnd = self.rounds[task.key]
        rnd.emit()
        rnd.first_token_s = rnd.last_token_s = self.loop.now_s
        self.metrics.prefill_time_s.observe(rnd.last_token_s - rnd.submit_s - rnd.kv_send_s)
        self.metrics.time_to_first_token_s.observe(rnd.first_token_s - rnd.submit_s)
        if self.spec.role is Role.PREFILL:
            del self._decode_specs[task.decode_worker]
            self._end(task.key)
        else:
            self.worker.join(task, len(rnd.token_ids))

    def _tokens(self, keys: Iterable[tuple[str, int]]) -> None:
        """The decode worker's step ended: each of these rounds has its next token."""
        now_s = self.loop.now_s
        for key in keys:
            rnd = self.rounds[key]
            rnd.emit()
            self.metrics.inter_token_latency_s.observe(now_s - rnd.last_token_s)
            rnd.last_token_s = now_s

    def round_done(self, session_id: str, round_index: int, itls: ItlSeries) -> None:
        """Sink: the round's last token is out."""
        self._end((session_id, round_index))

    def _end(self, key: tuple[str, int]) -> None:
        session_id = key[0]
        rnd = self.rounds.pop(key)
        self.metrics.decode_time_s.observe(rnd.last_token_s - rnd.first_token_s)
        rnd.events.put_nowait(None)
        if rnd.last_round:
            self.worker.kv.end_session(session_id)
            self._held.pop(session_id, None)


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
    p = argparse.ArgumentParser(prog="python -m ampd.serve.mock_engine", description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=("prefill", "decode"), required=True)
    p.add_argument("--worker-id", type=int, required=True)
    p.add_argument("--tp", type=int, required=True)
    p.add_argument("--server", type=int, default=0, help="server index (KV transfer times)")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model", default=_DEFAULTS.model)
    p.add_argument("--gpu", default=_DEFAULTS.gpu)
    p.add_argument("--network-gb-per-s", type=float, default=_DEFAULTS.network_gb_per_s, help="between servers")
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
