"""``T_dec(b, ctx)`` measured: ``b`` streams decoding together, and the decode step
inflated by a local prefill joining the same engine (how it mixes them).

Steady batch: the ``b`` prompts are warmed first (so their own prefills are a token
each and the streams join within a step or two), then streamed together with
``ignore_eos``. The engine's ``vllm:inter_token_latency_seconds`` is read between two
scrapes: the first once every stream has its second token, the second once the first
stream has ``window_tokens`` more, long before any stream ends (streams run to
``output_tokens``, several times the window, so a client or scrape slowed by a busy
machine still closes the window while all run). Every token in between was produced by a
step of exactly ``b`` sequences, so the mean inter-token latency is the step time. The
batch's context is the prompts plus the tokens generated, averaged over the window.

Mixed batch: while ``b`` streams run, one local prefill of ``l`` new tokens arrives.
How the engine mixes it in is read from the client's token times of the streams
(vLLM reports no per-step timing): a pause shows as one gap about ``T_pre(l)`` long,
chunked prefill as several gaps inflated alike, one per chunk. Client clocks, said so in the
profile.
"""

from __future__ import annotations

import asyncio
import math
import statistics
from dataclasses import dataclass

from ampd.profile.engine import ProbedEngine
from ampd.profile.scrape import INTER_TOKEN_LATENCY, NUM_RUNNING, ProbeError, delta, scrape

# [our choice] A gap carries a share of the prefill when its excess over the median gap
# is at least a quarter of the largest excess: chunks of one prefill inflate their steps
# alike (all but a short last chunk), while scheduling jitter of a busy client or engine
# adds a small fraction of one chunk. A gap of a full chunk has at least three quarters
# of the largest excess: the short last chunk of a mock Llama-3.1-8B on H100 (24 of 508
# tokens) still costs 60 % of a full one, the prefill's start-up cost being large.
_SHARE_OF_LARGEST = 0.25
_FULL_CHUNK_SHARE = 0.75


class WindowMissed(ProbeError):
    """A decode probe's window did not see exactly its batch running (worth one more
    try: a client slowed by the machine reads its streams late)."""


@dataclass(frozen=True, slots=True)
class DecodePoint:
    """One measured decode batch.

    Attributes:
        batch_size: sequences decoding together.
        prompt_tokens: each sequence's prompt.
        context_tokens: their KV in all, mean over the measurement window.
        step_s: mean time of one decode step (engine's inter-token latency), seconds.
        num_tokens: inter-token gaps the mean is over.
    """

    batch_size: int
    prompt_tokens: int
    context_tokens: int
    step_s: float
    num_tokens: int


@dataclass(frozen=True, slots=True)
class MixedPoint:
    """A local prefill joining a decode batch, seen from the batch's token times.

    Attributes:
        batch_size: sequences decoding.
        new_tokens: the local prefill's prompt (no history).
        plain_gap_s: median gap between two tokens of a stream, client clock, seconds.
        num_inflated_gaps: gaps of one stream, while the prefill ran, whose excess over
            ``plain_gap_s`` is at least a quarter of the largest (the most over the
            streams).
        num_full_chunk_gaps: those with at least three quarters of the largest excess
            (a short last chunk left out).
        max_gap_s: the largest gap while the prefill ran, client clock, seconds.
    """

    batch_size: int
    new_tokens: int
    plain_gap_s: float
    num_inflated_gaps: int
    num_full_chunk_gaps: int
    max_gap_s: float


async def _warm(engine: ProbedEngine, batch_size: int, prompt_tokens: int) -> list[tuple[list[int], str]]:
    prompts = [(engine.unique_prompt(prompt_tokens), engine.new_session()) for _ in range(batch_size)]
    for prompt, session in prompts:
        await engine.complete(prompt, 1, session)
    return prompts


async def measure_decode(engine: ProbedEngine, batch_size: int, prompt_tokens: int,
                         output_tokens: int, window_tokens: int) -> DecodePoint:
    """One steady batch (see the module docstring).

    Raises:
        WindowMissed: the engine was not running exactly ``batch_size`` requests at
            the end of the window.
        ProbeError: a stream failed, or the engine does not report inter-token latency.
    """
    prompts = await _warm(engine, batch_size, prompt_tokens)
    counts = [0] * batch_size
    started = [asyncio.Event() for _ in range(batch_size)]
    closed = asyncio.Event()

    async def one(i: int) -> None:
        prompt, session = prompts[i]
        # The window opens at every stream's second token, not its first: the gap
        # before a stream's second token can hold another stream's prefill.
        second = _Counter(counts, i, started[i], 2)
        closing = _Counter(counts, i, closed, 2 + window_tokens, count=False)
        await engine.stream_token_times(prompt, output_tokens, session, None, lambda: (second(), closing()))

    tasks = [asyncio.create_task(one(i)) for i in range(batch_size)]
    try:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), engine.request_timeout_s)
        before, generated_before = await scrape(engine.client, engine.url), sum(counts)
        await asyncio.wait_for(closed.wait(), engine.request_timeout_s)
        after, generated_after = await scrape(engine.client, engine.url), sum(counts)
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
    running = after.value(NUM_RUNNING)
    if running != batch_size:
        raise WindowMissed(f"{engine.url}: {running:g} requests running in a batch of {batch_size} at the end of "
                           "the window: the engine preempted or queued some (too little KV cache for this batch), "
                           "or a stream ended before a slow client closed the window")
    itl = delta(before, after, INTER_TOKEN_LATENCY)
    if itl.count <= 0:
        raise ProbeError(f"{engine.url}: no {INTER_TOKEN_LATENCY} observations while {batch_size} streams ran")
    context = batch_size * prompt_tokens + (generated_before + generated_after) / 2
    return DecodePoint(batch_size, prompt_tokens, round(context), itl.mean, int(itl.count))


class _Counter:
    """Counts stream ``i``'s tokens into ``counts`` (unless ``count`` is false: another
    counter of the stream does) and sets ``event`` once it has ``threshold``."""

    def __init__(self, counts: list[int], i: int, event: asyncio.Event, threshold: int, count: bool = True) -> None:
        self.counts, self.i, self.event, self.threshold, self.count = counts, i, event, threshold, count

    def __call__(self) -> None:
        self.counts[self.i] += self.count
        if self.counts[self.i] >= self.threshold:
            self.event.set()


async def measure_mixed(engine: ProbedEngine, batch_size: int, prompt_tokens: int, output_tokens: int,
                        new_tokens: int) -> MixedPoint:
    """A local prefill of ``new_tokens`` joining ``batch_size`` streams (see the module
    docstring). The prefill is sent once every stream has a quarter of its tokens.

    Raises:
        ProbeError: a stream or the prefill failed, or the prefill ran outside the
            streams (they ended first: raise ``output_tokens``).
    """
    prompts = await _warm(engine, batch_size, prompt_tokens)
    counts = [0] * batch_size
    quarter = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def one(i: int) -> list[float]:
        prompt, session = prompts[i]
        return await engine.stream_token_times(prompt, output_tokens, session, None,
                                               _Counter(counts, i, quarter, output_tokens // 4))

    streams = [asyncio.create_task(one(i)) for i in range(batch_size)]
    try:
        await asyncio.wait_for(quarter.wait(), engine.request_timeout_s)
        sent_s = loop.time()
        await engine.complete(engine.unique_prompt(new_tokens), 1, engine.new_session())
        done_s = loop.time()
        token_times = await asyncio.gather(*streams)
    finally:
        for task in streams:
            task.cancel()
    gaps = [[b - a for a, b in zip(times, times[1:])] for times in token_times]
    plain_s = statistics.median(g for stream in gaps for g in stream)
    during = [[b - a for a, b in zip(times, times[1:]) if b > sent_s and a < done_s] for times in token_times]
    if not any(during):
        raise ProbeError(f"{engine.url}: the {new_tokens}-token prefill ran after the streams ended; "
                         "raise output_tokens")
    largest_s = max(g for stream in during for g in stream)

    def most(share: float) -> int:
        cutoff_s = plain_s + share * (largest_s - plain_s)
        return max(sum(g >= cutoff_s for g in stream) for stream in during)
    return MixedPoint(batch_size, new_tokens, plain_s, most(_SHARE_OF_LARGEST), most(_FULL_CHUNK_SHARE), largest_s)


def chunk_budget_tokens(point: MixedPoint) -> int | None:
    """The token budget of a mixed step implied by ``point``, an estimate: ``k`` full
    chunks of a prefill of ``l`` tokens, each step also decoding ``b`` sequences, are
    chunks of at most ``l / k`` tokens, so the budget is about ``floor(l / k) + b``
    (exact when ``l`` is a multiple of the chunk; at most one chunk's count off when a
    short last chunk is counted as full). None when the prefill took one step (a
    pause, or a budget above ``l``)."""
    if point.num_inflated_gaps <= 1 or point.num_full_chunk_gaps < 1:
        return None
    return point.new_tokens // point.num_full_chunk_gaps + point.batch_size
