"""The mock engine: one simulated worker (prefill or decode role) in real time,
the rounds it serves and what its KV holds (its HTTP server: ``server.py``;
the requests it takes: ``requests.py``).

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
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ampd.config import ClusterConfig, RunConfig
from ampd.core.clock import ScaledClock
from ampd.core.deployment import Role, WorkerSpec
from ampd.core.errors import InputError
from ampd.core.task import PrefillTask
from ampd.engines.mock.metrics import MockEngineMetrics
from ampd.engines.mock.requests import CompletionRequest, RequestError, kv_int_param
from ampd.engines.mock.wallclock_loop import WallClockLoop
from ampd.metrics.records import ItlSeries
from ampd.perf.interface import PerfModel, RemoteStages
from ampd.policy.batching import Batching
from ampd.policy.reorder import Fcfs
from ampd.run.resolve import perf_model_for, require_tp
from ampd.sim.decode_worker import SimDecodeWorker
from ampd.sim.kv_cache import SessionKvCache
from ampd.sim.prefill_worker import SimPrefillWorker


logger = logging.getLogger(__name__)

DEFAULT_VOCAB_SIZE = 32_000  # [our choice] Llama-2's vocabulary size: ids a real tokenizer could give
# A mock started by hand times what a simulation of the default configuration would.
CLUSTER_DEFAULTS = ClusterConfig()


def token_id(session_id: str, prompt_tokens: int, position: int, vocab_size: int = DEFAULT_VOCAB_SIZE) -> int:
    """Output token ``position`` (0-based) of the round of ``session_id`` whose
    prompt is ``prompt_tokens`` long: a hash, in ``[0, vocab_size)``."""
    key = f"{session_id}\x00{prompt_tokens}\x00{position}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") % vocab_size


def engine_perf_model(model: str, gpu: str, network_gb_per_s: float = CLUSTER_DEFAULTS.network_gb_per_s,
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
    model: str = CLUSTER_DEFAULTS.model
    gpu: str = CLUSTER_DEFAULTS.gpu
    network_gb_per_s: float = CLUSTER_DEFAULTS.network_gb_per_s
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
        hist_tokens = kv_int_param(params, "ampd_hist_tokens", 0, len(request.prompt) - 1, default=0)
        decode_spec = WorkerSpec(-1, Role.DECODE, kv_int_param(params, "ampd_decode_tp", 1, default=self.spec.tp),
                                 kv_int_param(params, "ampd_decode_server", 0, default=self.spec.server))
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
