"""``ampd replay``: the open-loop load generator. Replays sessions against an
OpenAI-compatible ``/v1/completions`` endpoint (the AMPD coordinator, or one engine)
with the simulator's timing semantics, so its records compare with ``ampd simulate``.

Timing (model seconds through a ``ScaledClock``, relative to the replay's start):
session ``s`` arrives at ``s.arrival_s``; round 0 is sent then; round ``r > 0`` when its
input is ready, i.e. ``tool_s`` of round ``r - 1`` after that round's last token arrived
(``RoundRecord.ready_s``, as in ``ampd.sim.cluster``). Sessions run concurrently and
open loop: a slow server never delays later arrivals.

Prompts: round 0 sends ``input_tokens`` pseudo-random ids; round ``r`` sends the
previous prompt, the previous output ids as streamed back, and ``input_tokens`` new
ids (the tool output), so the server's prefix cache holds all but the new ids.

Failover (``retry_s`` > 0, for fault benchmarks): a round that fails in a way a
retry may mend (connection lost, 409, 429, 5xx, a stream cut short) is sent
again, from its start, to the next server URL, every ``RETRY_PAUSE_S``, for up
to ``retry_s`` wall seconds; its TTFT still counts from when its input was
ready. A round that stays silent for ``timeout_s`` is *hung*: never retried.
Without failover (``ampd replay``) a failed round fails its session, a 409 too:
a round is sent only after the previous one's ``[DONE]``, when the coordinator
has released its session (docs/SERVING.md, "API"), so a 409 is a fault.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import ssl
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import httpx
from tqdm import tqdm

from ampd.core.errors import InputError
from ampd.core.session import Session
from ampd.measure import TRANSIENT, MeasurePlan, Stability, measure_window
from ampd.metrics.records import RoundRecord, SessionRecord
from ampd.metrics.slo import SloScope
from ampd.metrics.summary import RunSummary, summarize
from ampd.core.clock import ScaledClock
from ampd.engines.client import ERROR_TEXT_CHARS, error_message

# Request headers (read by the coordinator) and response headers (set by it).
SESSION_ID_HEADER = "X-Session-Id"
LAST_ROUND_HEADER = "X-Session-Last-Round"
DECODE_WORKER_HEADER = "X-Ampd-Decode-Worker"
PREFILL_WORKER_HEADER = "X-Ampd-Prefill-Worker"
LOCAL_HEADER = "X-Ampd-Local"

COMPLETIONS_PATH = "/v1/completions"
DEFAULT_VOCAB_SIZE = 32_000  # [our choice] ids every common tokenizer accepts (Llama-2: 32000; Llama-3, Qwen: more)
DEFAULT_TIMEOUT_S = 300.0  # [our choice] longest silence tolerated on one request, wall seconds
RETRY_PAUSE_S = 0.5  # [our choice] wall seconds between two tries of a round (a 409's Retry-After is 1 s)
RETRYABLE_STATUS = frozenset({409, 429, 500, 502, 503, 504})

Failure = tuple[str, int, str]  # (session_id, round_index, reason)


class RoundFailed(Exception):
    """A round that did not deliver its full output; the message is the reason,
    ``retryable`` whether sending it again (elsewhere) may succeed."""

    def __init__(self, reason: str, retryable: bool = False) -> None:
        super().__init__(reason)
        self.retryable = retryable


@dataclass
class ReplayResult:
    """A finished replay.

    Attributes:
        sessions: one record per session, in arrival order; times in model seconds
            relative to ``start_s``. A failed session keeps its rounds up to the one
            that failed (that one without ``done_s``) and has no ``done_s``.
        failed: ``(session_id, round_index, reason)`` of each failed session, in
            arrival order; its later rounds were not sent.
        start_s: the clock's model time at the replay's start (time 0 of the records).
        wall_s: wall-clock duration of the replay, seconds.
        summary: ``ampd.metrics.summary.summarize`` of ``sessions`` (of those
            arriving in the measurement window, with a plan); failed sessions
            count as not attaining the SLO.
        stability: the verdict (``transient`` without a plan).
        retries: ``(session_id, round_index, reason)`` of each try that failed
            and was sent again (``retry_s``).
    """

    sessions: list[SessionRecord]
    failed: list[Failure]
    start_s: float
    wall_s: float
    summary: RunSummary
    stability: Stability = Stability(TRANSIENT, "a fixed set of sessions")
    retries: list[Failure] = field(default_factory=list)


def prompt_rng(seed: int, session_id: str) -> random.Random:
    """The generator of one session's token ids: a function of the replay seed and
    the session id only, so a prompt does not depend on other sessions or timing."""
    return random.Random(f"{seed}/{session_id}")


def new_token_ids(rng: random.Random, num_tokens: int, vocab_size: int) -> list[int]:
    """``num_tokens`` ids drawn uniformly from ``[0, vocab_size)``."""
    return [rng.randrange(vocab_size) for _ in range(num_tokens)]


def request_body(model: str, prompt: list[int], max_tokens: int, session_id: str) -> dict:
    """The streaming completion request of one round (docs/SERVING.md, API):
    greedy, exactly ``max_tokens`` output tokens, token ids in every chunk, the
    session named in the body too (ids that cannot be a header value)."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True, "stream": True, "stream_options": {"include_usage": True},
            "session_id": session_id}


def request_headers(session_id: str, last_round: bool) -> dict[str, str]:
    """``X-Session-Id`` when the id can be a header value (printable ASCII; the
    body's ``session_id`` carries it anyway); ``X-Session-Last-Round: true`` on a
    session's last round, so the coordinator can free the session's binding."""
    headers = {SESSION_ID_HEADER: session_id} if session_id.isascii() and session_id.isprintable() else {}
    if last_round:
        headers[LAST_ROUND_HEADER] = "true"
    return headers


def _int_header(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def note_placement(record: RoundRecord, headers: Mapping[str, str]) -> None:
    """Fill where the round ran from the coordinator's response headers
    (``X-Ampd-Decode-Worker``, ``X-Ampd-Prefill-Worker``: worker ids;
    ``X-Ampd-Local``: true/false). Absent or unparsable: decode worker -1,
    prefill worker and local None."""
    decode_worker = _int_header(headers, DECODE_WORKER_HEADER)
    record.decode_worker = -1 if decode_worker is None else decode_worker
    record.prefill_worker = _int_header(headers, PREFILL_WORKER_HEADER)
    local = headers.get(LOCAL_HEADER)
    record.local = None if local is None else local.strip().lower() in ("true", "1", "yes")


def note_tokens(record: RoundRecord, num_tokens: int, at_s: float, last_s: float | None) -> None:
    """Record a chunk of ``num_tokens`` (>= 1) tokens received at ``at_s``; ``last_s``
    is when the previous token arrived (None: these are the round's first tokens).

    The first token sets ``first_token_s``; every later token adds one ITL: the
    chunk's first token the gap since ``last_s``, each further token of the same
    chunk a gap of 0 (they arrived together). A round's ITLs thus number
    ``output_tokens - 1`` however the server groups tokens into chunks.
    """
    if last_s is None:
        record.first_token_s = at_s
        record.itls_s.extend([0.0] * (num_tokens - 1))
        return
    record.itls_s.append(at_s - last_s)
    record.itls_s.extend([0.0] * (num_tokens - 1))


def _chunk_token_ids(data: str) -> list[int]:
    """The token ids of one SSE ``data:`` payload (none for a usage-only chunk).

    Raises:
        RoundFailed: the payload is not JSON, is an error chunk, or carries text
            without ``token_ids`` (a server without ``return_token_ids``).
    """
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        raise RoundFailed(f"bad stream chunk (not JSON): {data[:ERROR_TEXT_CHARS]!r}") from None
    if not isinstance(chunk, dict):
        raise RoundFailed(f"bad stream chunk (not an object): {data[:ERROR_TEXT_CHARS]!r}")
    if "error" in chunk:
        code = chunk["error"].get("code") if isinstance(chunk["error"], dict) else None
        raise RoundFailed(f"stream error: {error_message(chunk, data)}", code in RETRYABLE_STATUS)
    choices = chunk.get("choices") or []
    if not choices:
        return []
    token_ids = choices[0].get("token_ids")
    if token_ids is None:
        if choices[0].get("text"):
            raise RoundFailed("stream chunk has text but no token_ids: the server must support return_token_ids")
        return []
    return list(token_ids)


async def _http_error(response: httpx.Response) -> RoundFailed:
    """``HTTP <status>: <message>`` of an error reply."""
    text = (await response.aread()).decode(errors="replace")
    try:
        payload = json.loads(text)
    except json.JSONDecodeError:
        payload = None
    return RoundFailed(f"HTTP {response.status_code}: {error_message(payload, text)}",
                       response.status_code in RETRYABLE_STATUS)


class _Replayer:
    """Runs sessions against one endpoint; holds what every round needs.

    Each session has its own HTTP client, hence its own one-connection pool that its
    rounds reuse: httpcore's shared pool scans every connection on each request and
    response, which made one shared client cost O(sessions in flight) per chunk.
    """

    def __init__(self, urls: Sequence[str], model: str, clock: ScaledClock, vocab_size: int, seed: int,
                 timeout_s: float, retry_s: float) -> None:
        self.ssl_context = ssl.create_default_context()  # built once: loading CA certificates takes milliseconds
        self.urls = [url.rstrip("/") + COMPLETIONS_PATH for url in urls]
        self.retry_s = retry_s
        self.retries: list[Failure] = []
        self.model = model
        self.clock = clock
        self.vocab_size = vocab_size
        self.seed = seed
        self.timeout_s = timeout_s
        self.start_s = clock.now_s()

    def now_s(self) -> float:
        """Model seconds since the replay's start."""
        return self.clock.now_s() - self.start_s

    async def sleep_until(self, at_s: float) -> None:
        """Wait until ``at_s`` model seconds after the start (no wait if past)."""
        delay_s = at_s - self.now_s()
        if delay_s > 0:
            await self.clock.sleep(delay_s)

    async def run_session(self, session: Session, record: SessionRecord) -> Failure | None:
        """Send the session's rounds in order, filling ``record``; the failure that
        stopped it, or None when every round completed."""
        rng = prompt_rng(self.seed, session.session_id)
        history: list[int] = []
        ready_s = session.arrival_s
        await self.sleep_until(ready_s)  # no connection is opened before the session arrives
        async with self.new_client() as client:
            for index, rnd in enumerate(session.rounds):
                await self.sleep_until(ready_s)
                prompt = history + new_token_ids(rng, rnd.input_tokens, self.vocab_size)
                round_record = RoundRecord(session.session_id, index, ready_s, len(history), rnd.input_tokens,
                                           rnd.output_tokens, decode_worker=-1)
                record.rounds.append(round_record)
                try:
                    output_ids = await self.send_with_retries(client, round_record, prompt,
                                                              index == len(session.rounds) - 1)
                except RoundFailed as err:
                    return session.session_id, index, str(err)
                history = prompt + output_ids
                ready_s = round_record.done_s + rnd.tool_s
        record.done_s = record.rounds[-1].done_s
        return None

    def new_client(self) -> httpx.AsyncClient:
        """A client for one session: ``timeout_s`` on every step of a request, and
        no proxy from the environment between the load generator and the server."""
        return httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s), verify=self.ssl_context, trust_env=False)

    async def send_with_retries(self, client: httpx.AsyncClient, record: RoundRecord, prompt: list[int],
                                last_round: bool) -> list[int]:
        """``send_round`` to the first URL, then (a retryable failure, within
        ``retry_s``) again to the next ones in turn, the record reset each time."""
        deadline = time.monotonic() + self.retry_s
        attempt = 0
        while True:
            try:
                return await self.send_round(client, self.urls[attempt % len(self.urls)], record, prompt, last_round)
            except RoundFailed as err:
                if not err.retryable or time.monotonic() >= deadline:
                    raise
                self.retries.append((record.session_id, record.round_index, str(err)))
            record.first_token_s, record.done_s = None, None
            record.itls_s.clear()
            attempt += 1
            await asyncio.sleep(RETRY_PAUSE_S)

    async def send_round(self, client: httpx.AsyncClient, url: str, record: RoundRecord, prompt: list[int],
                         last_round: bool) -> list[int]:
        """POST one round and stream its output, filling ``record`` (placement,
        first token, ITLs, ``done_s``); the output token ids.

        Raises:
            RoundFailed: an error status, a broken or silent (``timeout_s``)
                connection, a malformed stream, or an output whose length is not
                ``record.output_tokens``.
        """
        body = request_body(self.model, prompt, record.output_tokens, record.session_id)
        headers = request_headers(record.session_id, last_round)
        try:
            async with client.stream("POST", url, json=body, headers=headers) as response:
                if response.status_code >= 400:
                    raise await _http_error(response)
                note_placement(record, response.headers)
                output_ids, last_s = await self.read_stream(response, record)
        except httpx.TimeoutException as err:
            raise RoundFailed(f"timeout: no reply for {self.timeout_s:g} s ({type(err).__name__})") from None
        except httpx.HTTPError as err:
            raise RoundFailed(f"connection error: {type(err).__name__}: {err}", retryable=True) from None
        if len(output_ids) != record.output_tokens:
            raise RoundFailed(f"output of {len(output_ids)} tokens, expected {record.output_tokens}")
        record.done_s = last_s
        return output_ids

    async def read_stream(self, response: httpx.Response, record: RoundRecord) -> tuple[list[int], float | None]:
        """Read the SSE stream to ``data: [DONE]``, timing each chunk that carries
        tokens on receipt; the output ids and when the last one arrived.

        Raises:
            RoundFailed: a malformed or error chunk, or a stream that ends before ``[DONE]``.
        """
        output_ids: list[int] = []
        last_s: float | None = None
        done = False
        async for line in response.aiter_lines():
            if done or not line.startswith("data:"):
                continue  # read to the end (the connection is reused); skip separators, comments, other fields
            data = line.removeprefix("data:").strip()
            if data == "[DONE]":
                done = True
                continue
            token_ids = _chunk_token_ids(data)
            if token_ids:
                at_s = self.now_s()
                note_tokens(record, len(token_ids), at_s, last_s)
                output_ids += token_ids
                last_s = at_s
        if not done:
            raise RoundFailed(f"stream ended before [DONE] after {len(output_ids)} of {record.output_tokens} tokens",
                              retryable=True)
        return output_ids, last_s


def _check_inputs(sessions: Sequence[Session], vocab_size: int, timeout_s: float) -> None:
    if vocab_size < 1:
        raise InputError(f"vocab_size: must be >= 1, got {vocab_size}")
    if not timeout_s > 0:
        raise InputError(f"timeout_s: must be > 0, got {timeout_s}")
    seen: set[str] = set()
    for s in sessions:
        if s.session_id in seen:
            raise InputError(f"session id {s.session_id!r} appears twice; session ids must be unique")
        seen.add(s.session_id)


async def replay(url: str, sessions: Sequence[Session], *, model: str, clock: ScaledClock, ttft_slo_s: float,
                 itl_slo_s: float, scope: SloScope = SloScope.MEAN, vocab_size: int = DEFAULT_VOCAB_SIZE,
                 seed: int = 0, timeout_s: float = DEFAULT_TIMEOUT_S, progress: bool = False,
                 plan: MeasurePlan | None = None, failover_urls: Sequence[str] = (),
                 retry_s: float = 0.0) -> ReplayResult:
    """Replay ``sessions`` against ``url`` (the server's base URL, e.g.
    ``http://127.0.0.1:8000``) and summarise them under the given thresholds.

    Args:
        model: the ``model`` field of every request (the server's model name).
        clock: model time; its ``time_scale`` compresses the trace (1: real time).
        ttft_slo_s, itl_slo_s, scope: SLO thresholds (model seconds) and scope
            for the summary.
        vocab_size: prompt ids are drawn from ``[0, vocab_size)``.
        seed: with each session id, seeds that session's prompt ids.
        timeout_s: longest wait, wall seconds, for any step of a request
            (connect, reply headers, next chunk); past it the round fails.
        progress: show a tqdm bar of finished sessions on stderr.
        plan: a steady-state measurement (``ampd.measure``): the replay stops once
            every session arriving in the window has finished, or at the plan's
            horizon (sessions still running are cut off; sessions not yet arrived
            are not sent), and the summary and verdict are the window's. None:
            every session runs to its end and all count (a transient).
        failover_urls, retry_s: where a round that failed retryably is sent
            again, for up to ``retry_s`` wall seconds (0: never retried).

    Raises:
        InputError: duplicate session ids, ``vocab_size < 1``, ``timeout_s <= 0``.
        A failing server raises nothing: its sessions are in ``ReplayResult.failed``.
    """
    _check_inputs(sessions, vocab_size, timeout_s)
    ordered = sorted(sessions, key=lambda s: s.arrival_s)
    records = [SessionRecord(s.session_id, s.arrival_s, len(s.rounds)) for s in ordered]
    wall_start_s = time.perf_counter()
    replayer = _Replayer([url, *failover_urls], model, clock, vocab_size, seed, timeout_s, retry_s)
    window = (plan.warmup_s, plan.warmup_s + plan.window_s) if plan else (-math.inf, math.inf)
    measured_left = sum(window[0] <= s.arrival_s < window[1] for s in ordered)
    all_measured_done = asyncio.Event()
    with tqdm(total=len(ordered), desc="sessions", unit="session", file=sys.stderr, disable=not progress) as bar:
        async def run_one(session: Session, record: SessionRecord) -> Failure | None:
            nonlocal measured_left
            failure = await replayer.run_session(session, record)
            bar.update()
            if window[0] <= session.arrival_s < window[1]:
                measured_left -= 1
                if measured_left == 0:
                    all_measured_done.set()
            return failure

        tasks = [asyncio.create_task(run_one(s, r)) for s, r in zip(ordered, records, strict=True)]
        stopped = await _until_measured(tasks, all_measured_done, replayer, plan)
    outcomes = [t.result() for t in tasks if not t.cancelled()]
    failed = [f for f in outcomes if f is not None]
    if plan is None:
        return ReplayResult(records, failed, replayer.start_s, time.perf_counter() - wall_start_s,
                            summarize(records, ttft_slo_s, itl_slo_s, scope), retries=replayer.retries)
    arrived = [r for r in records if r.arrival_s <= replayer.now_s()]
    summary, stability = measure_window(arrived, plan, ttft_slo_s, itl_slo_s, scope, stopped)
    return ReplayResult(arrived, failed, replayer.start_s, time.perf_counter() - wall_start_s, summary, stability,
                        replayer.retries)


async def _until_measured(tasks: list[asyncio.Task], all_measured_done: asyncio.Event, replayer: _Replayer,
                          plan: MeasurePlan | None) -> str | None:
    """Wait for every task (no plan), or until the measured sessions have all
    finished or the plan's horizon has passed, then cancel the rest; why the
    replay stopped before its measured sessions finished, or None."""
    if plan is None:
        await asyncio.gather(*tasks)
        return None
    done = asyncio.create_task(all_measured_done.wait())
    horizon = asyncio.create_task(replayer.sleep_until(plan.horizon_s))
    await asyncio.wait({done, horizon}, return_when=asyncio.FIRST_COMPLETED)
    stopped = None if all_measured_done.is_set() else (
        f"measured sessions still running {plan.drain_s:.0f} s after the window")
    for task in [*tasks, done, horizon]:
        task.cancel()
    await asyncio.gather(*tasks, done, horizon, return_exceptions=True)
    return stopped


def replay_sync(url: str, sessions: Sequence[Session], **kwargs) -> ReplayResult:
    """``replay`` run to completion in a new event loop (same arguments)."""
    return asyncio.run(replay(url, sessions, **kwargs))


async def replay_across(urls: Sequence[str], sessions: Sequence[Session], **kwargs) -> list[ReplayResult]:
    """Replay ``sessions`` through several coordinator replicas at once, session
    ``i`` through ``urls[i % len(urls)]`` (arrival times kept): what a load
    balancer in front of the replicas would do; with ``retry_s``, a round fails
    over to the other URLs in turn. Arguments as ``replay``; one result per URL."""
    parts = [list(sessions)[i::len(urls)] for i in range(len(urls))]
    return await asyncio.gather(*(replay(url, part, failover_urls=[*urls[i + 1:], *urls[:i]], **kwargs)
                                  for i, (url, part) in enumerate(zip(urls, parts))))
