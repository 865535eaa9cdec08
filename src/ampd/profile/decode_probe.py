"""``T_dec(b, ctx)`` measured: ``b`` streams decoding together; and how the engine
mixes a local prefill into its decode steps. Both read the engine's own counters only:
a client on a busy machine reads its streams late (and vLLM then merges tokens into
one chunk), so client clocks would measure the client.

Steady batch: the ``b`` prompts are warmed first (so their own prefills are a token
each), then streamed together with ``ignore_eos``. The window is taken from
``/metrics``: it opens once the engine runs all ``b`` and one more step has gone by
(the gap before it may hold the last joiner's prefill), and closes after
``b x window_tokens`` more inter-token observations; at its end the engine must still
run exactly ``b`` (else the window is missed and the streams made longer). The mean of
``vllm:inter_token_latency_seconds`` over the window is the step time. Then the streams
are dropped (vLLM aborts a request whose client left) and the engine left to drain.

Mixed batch: during a steady batch, one local prefill of ``l`` new tokens arrives. Each
step that carries part of it is longer than a plain one; the steps of the ``b``
streams above a bucket bound of the inter-token histogram, less the plain window's
rate of such steps, counted over the prefill, divided by ``b``, are the steps it took.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ampd.profile.engine import ProbedEngine
from ampd.profile.scrape import (INTER_TOKEN_LATENCY, NUM_RUNNING, ProbeError, Snapshot, count_above, delta, poll,
                                 scrape)

# [our choice] A step counts as carrying part of the prefill when it is longer than the
# smallest histogram bucket bound at or above 1.25 x the plain step's mean: vLLM's
# buckets (10, 25, 50, 75, 100 ms, ...) sit within a factor 2.5 of each other, and a
# step that carries a chunk of a few hundred tokens is several times a plain one.
_INFLATED_FACTOR = 1.25
# [our choice] Plain steps above that bound must be rare for the count to mean anything.
_MAX_PLAIN_SHARE_ABOVE = 0.05
_PLAIN_WINDOW_STEPS = 16


class WindowMissed(ProbeError):
    """A decode probe's window did not see exactly its batch running (the streams ended
    first, or the engine preempted some)."""


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
    """A local prefill joining a decode batch, seen in the engine's inter-token
    histogram.

    Attributes:
        batch_size: sequences decoding.
        new_tokens: the local prefill's prompt (no history).
        plain_step_s: mean step before the prefill, seconds.
        bound_s: the bucket bound above which a step counts as carrying the prefill.
        num_prefill_steps: steps that carried part of it (rounded).
    """

    batch_size: int
    new_tokens: int
    plain_step_s: float
    bound_s: float
    num_prefill_steps: int


def _gaps(snapshot: Snapshot) -> float:
    return snapshot.value(f"{INTER_TOKEN_LATENCY}_count")


class _Batch:
    """``b`` warmed streams on one engine, the window's snapshots, and the drain."""

    def __init__(self, engine: ProbedEngine, batch_size: int, prompt_tokens: int, output_tokens: int) -> None:
        self.engine, self.batch_size = engine, batch_size
        self.prompt_tokens, self.output_tokens = prompt_tokens, output_tokens
        self.tasks: list[asyncio.Task] = []

    async def __aenter__(self) -> _Batch:
        e = self.engine
        prompts = [(e.unique_prompt(self.prompt_tokens), e.new_session()) for _ in range(self.batch_size)]
        for prompt, session in prompts:
            await e.complete(prompt, 1, session)
        self.start = await scrape(e.client, e.url)
        self.tasks = [asyncio.create_task(e.stream(prompt, self.output_tokens, session)) for prompt, session in prompts]
        all_in = await self.until(lambda s: s.value(NUM_RUNNING) >= self.batch_size, "batch running")
        self.steady = await self.until(lambda s: _gaps(s) >= _gaps(all_in) + self.batch_size, "first full step")
        return self

    async def until(self, ready, what: str) -> Snapshot:
        """The first snapshot ``ready`` accepts, while the streams run."""
        e = self.engine
        watch = asyncio.create_task(poll(e.client, e.url, ready, e.request_timeout_s, what))
        done, _ = await asyncio.wait([watch, *self.tasks], return_when=asyncio.FIRST_COMPLETED)
        if watch not in done:
            watch.cancel()
            for task in done:
                task.result()  # a stream that failed says why
            raise WindowMissed(f"{e.url}: the streams of {self.output_tokens} tokens ended before the {what}")
        return watch.result()

    def generated_per_stream(self, snapshot: Snapshot) -> float:
        """Tokens each stream has generated by ``snapshot`` (its first has no gap)."""
        return (_gaps(snapshot) - _gaps(self.start)) / self.batch_size + 1

    async def __aexit__(self, *exc) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        e = self.engine
        await poll(e.client, e.url, lambda s: s.value(NUM_RUNNING) == 0, e.request_timeout_s, "drain to idle")


async def measure_decode(engine: ProbedEngine, batch_size: int, prompt_tokens: int,
                         output_tokens: int, window_tokens: int) -> DecodePoint:
    """One steady batch (see the module docstring).

    Raises:
        WindowMissed: the streams ended before the window closed, or the engine ran
            other than ``batch_size`` requests at its end (preemption: too little KV).
        ProbeError: a stream failed, or the engine does not report what is needed.
    """
    async with _Batch(engine, batch_size, prompt_tokens, output_tokens) as batch:
        before = batch.steady
        after = await batch.until(lambda s: _gaps(s) >= _gaps(before) + batch_size * window_tokens, "window's end")
    running = after.value(NUM_RUNNING)
    if running != batch_size:
        raise WindowMissed(f"{engine.url}: {running:g} requests running in a batch of {batch_size} at the end of "
                           "the window: the engine preempted or queued some (too little KV cache for this batch)")
    itl = delta(before, after, INTER_TOKEN_LATENCY)
    generated = (batch.generated_per_stream(before) + batch.generated_per_stream(after)) / 2
    return DecodePoint(batch_size, prompt_tokens, round(batch_size * (prompt_tokens + generated)), itl.mean,
                       int(itl.count))


async def measure_decode_until_seen(engine: ProbedEngine, batch_size: int, prompt_tokens: int, output_tokens: int,
                                    window_tokens: int, max_output_tokens: int,
                                    missed: list[str]) -> DecodePoint:
    """``measure_decode``, its streams made twice as long after each missed window (a
    fast engine ends a short stream within a few ``/metrics`` scrapes of a busy
    machine), up to ``max_output_tokens``; each miss is noted in ``missed``.

    Raises:
        WindowMissed: missed with streams of ``max_output_tokens``.
    """
    while True:
        try:
            return await measure_decode(engine, batch_size, prompt_tokens, output_tokens, window_tokens)
        except WindowMissed as err:
            missed.append(f"{err} (streams of {output_tokens} tokens)")
            if output_tokens >= max_output_tokens:
                raise
            output_tokens = min(2 * output_tokens, max_output_tokens)


async def measure_mixed(engine: ProbedEngine, batch_size: int, prompt_tokens: int, output_tokens: int,
                        new_tokens: int) -> MixedPoint:
    """A local prefill of ``new_tokens`` joining ``batch_size`` steady streams (see the
    module docstring).

    Raises:
        WindowMissed: the streams ended before the prefill's steps were counted.
        ProbeError: a request failed, the engine reports no inter-token histogram, or
            its plain steps vary too much to tell a prefill's steps from them.
    """
    async with _Batch(engine, batch_size, prompt_tokens, output_tokens) as batch:
        before = batch.steady
        plain = await batch.until(lambda s: _gaps(s) >= _gaps(before) + batch_size * _PLAIN_WINDOW_STEPS,
                                  "plain window's end")
        await engine.complete(engine.unique_prompt(new_tokens), 1, engine.new_session())
        returned = await scrape(engine.client, engine.url)
        # The decode tokens of the prefill's last step are recorded with its first token:
        # one more step and they are in.
        after = await batch.until(lambda s: _gaps(s) >= _gaps(returned) + batch_size, "step after the prefill")
    plain_s = delta(before, plain, INTER_TOKEN_LATENCY).mean
    bounds = sorted(b for b in plain.buckets.get(INTER_TOKEN_LATENCY, {}) if b >= _INFLATED_FACTOR * plain_s)
    if not bounds or bounds[0] == float("inf"):
        raise ProbeError(f"{engine.url}: {INTER_TOKEN_LATENCY} has no bucket bound above {plain_s * 1e3:.1f} ms")
    bound = bounds[0]
    plain_gaps = delta(before, plain, INTER_TOKEN_LATENCY).count
    plain_rate = count_above(before, plain, INTER_TOKEN_LATENCY, bound) / plain_gaps
    if plain_rate > _MAX_PLAIN_SHARE_ABOVE:
        raise ProbeError(f"{engine.url}: {plain_rate:.0%} of plain decode steps exceed {bound * 1e3:g} ms (mean "
                         f"{plain_s * 1e3:.1f} ms): too irregular to count a prefill's steps")
    mixed_gaps = delta(plain, after, INTER_TOKEN_LATENCY).count
    excess = count_above(plain, after, INTER_TOKEN_LATENCY, bound) - plain_rate * mixed_gaps
    return MixedPoint(batch_size, new_tokens, plain_s, bound, max(0, round(excess / batch_size)))


async def search_chunk_budget(engine: ProbedEngine, batch_size: int, prompt_tokens: int, output_tokens: int,
                              max_new_tokens: int) -> list[MixedPoint]:
    """Mixed probes that find the largest prefill the engine runs in one step beside
    ``batch_size`` decoding sequences: one at ``max_new_tokens``; when that took more
    than one step, a binary search for the largest size that took one. Returns every
    probe, in order (``chunk_budget_tokens`` reads them)."""
    points = [await measure_mixed(engine, batch_size, prompt_tokens, output_tokens, max_new_tokens)]
    if points[0].num_prefill_steps <= 1:
        return points
    one_step, more = 1, max_new_tokens  # the largest size seen in one step, the smallest seen in more
    while more - one_step > max(1, one_step // 64):  # [our choice] to within 1.6 %: ~7 probes from 3k tokens
        size = (one_step + more) // 2
        points.append(await measure_mixed(engine, batch_size, prompt_tokens, output_tokens, size))
        if points[-1].num_prefill_steps <= 1:
            one_step = size
        else:
            more = size
    return points


def chunk_budget_tokens(points: list[MixedPoint]) -> int | None:
    """The token budget of a mixed step: the largest prefill one step took plus the
    ``b`` decoding sequences that shared the step (one token each); None when even
    the largest probe took one step (a pause, or a budget above it)."""
    if not points or all(p.num_prefill_steps <= 1 for p in points):
        return None
    largest = max((p for p in points if p.num_prefill_steps <= 1), key=lambda p: p.new_tokens, default=None)
    return (largest.new_tokens if largest else 0) + points[0].batch_size
