"""``T_pre(l_hist, l_incr)`` measured: one incremental prefill at a time on an idle
engine, its history in the engine's prefix cache.

A probe draws a prompt no earlier probe shares, warms its first ``hist`` tokens with a
``max_tokens=1`` request, then sends the whole prompt with ``max_tokens=1``. The hit is
read back from the reply (``cached_tokens``: vLLM caches whole blocks, so it can be
less than ``hist``), and the sample is ``(cached, prompt - cached, prefill time)`` with
the time from the engine's ``vllm:request_prefill_time_seconds``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampd.profile.engine import ProbedEngine, cached_tokens
from ampd.profile.scrape import PREFILL_TIME, ProbeError, delta, scrape, settled


@dataclass(frozen=True, slots=True)
class PrefillPoint:
    """One measured prefill.

    Attributes:
        hist_tokens: tokens the engine took from its prefix cache.
        new_tokens: tokens it computed.
        time_s: the engine's prefill time, seconds.
    """

    hist_tokens: int
    new_tokens: int
    time_s: float


async def measure_prefill(engine: ProbedEngine, hist_tokens: int, new_tokens: int,
                          settle_timeout_s: float = 30.0) -> PrefillPoint:
    """One probe (see the module docstring).

    Raises:
        ProbeError: the engine failed a request, does not report the prefill time or
            the cached tokens, or the history was not cached at all (prefix caching
            off: vLLM's ``--enable-prefix-caching``), or more than the history was (the
            engine holds an earlier profile's prompts of the same seed).
    """
    prompt = engine.unique_prompt(hist_tokens + new_tokens)
    session = engine.new_session()
    if hist_tokens:
        await engine.complete(prompt[:hist_tokens], 1, session)
    before = await scrape(engine.client, engine.url)
    reply = await engine.complete(prompt, 1, session)
    (after,) = await settled(engine.client, [before], PREFILL_TIME, 1, settle_timeout_s)
    hit = cached_tokens(reply, engine.url)
    if hist_tokens and hit == 0:
        raise ProbeError(f"{engine.url}: a {hist_tokens}-token history just sent was not cached: enable "
                         "prefix caching (vLLM: --enable-prefix-caching)")
    if hit > hist_tokens:
        # The prompts are the seed's: an engine that served a profile of the same seed holds them.
        raise ProbeError(f"{engine.url}: {hit} tokens of a fresh prompt were already cached (the probe sent "
                         f"{hist_tokens} first): the engine served this seed's prompts before, in an earlier "
                         "profile; restart the engines or profile with another --seed")
    return PrefillPoint(hit, len(prompt) - hit, delta(before, after, PREFILL_TIME).sum)
