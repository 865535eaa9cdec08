"""The serving path of one engine request measured: what a request takes beyond the
engine's own time to first token.

A probe streams a fresh short prompt with ``max_tokens=2`` and times, on the client,
from sending it to the first token's arrival; the engine's own TTFT for it is the gain
of ``vllm:time_to_first_token_seconds`` (vLLM counts from when its API server has
taken the request in to when the first token leaves the engine). The difference is
the request's serving path: the HTTP legs both ways, the API server's parsing,
validation and streaming of the first chunk. vLLM's API server is the same for a
prefill and a decode engine, so it is measured on the decode engine, which answers
plain requests (``ampd.profile.run``).

A mock engine runs on a scaled clock (``ampd_mock_time_scale``: wall seconds per
model second, in its ``/metrics``); the client's wall time is turned into model
seconds with it, so the overhead is in the unit the engine's counters and the cost
model are in. vLLM has no such gauge: scale 1.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from ampd.profile.engine import ProbedEngine
from ampd.profile.scrape import TIME_SCALE, TIME_TO_FIRST_TOKEN, delta, scrape, settled

# [our choice] A short prompt: the serving path is what is measured, not the prefill
# (16 tokens: a few milliseconds of prefill on the tiny CPU model, far less on a GPU).
PROBE_PROMPT_TOKENS = 16


@dataclass(frozen=True, slots=True)
class OverheadPoint:
    """One measured request.

    Attributes:
        client_ttft_s: from sending to the first token's arrival, on the client
            (model seconds for a mock engine).
        engine_ttft_s: the engine's own TTFT for it, seconds.
    """

    client_ttft_s: float
    engine_ttft_s: float

    @property
    def overhead_s(self) -> float:
        """The request's serving path, seconds."""
        return self.client_ttft_s - self.engine_ttft_s


async def measure_overhead(engine: ProbedEngine, settle_timeout_s: float = 30.0) -> OverheadPoint:
    """One probe (see the module docstring).

    Raises:
        ProbeError: the engine failed the request or does not report its TTFT.
    """
    prompt, session = engine.unique_prompt(PROBE_PROMPT_TOKENS), engine.new_session()
    before = await scrape(engine.client, engine.url)
    first = asyncio.Event()
    sent_s = time.perf_counter()
    streaming = asyncio.create_task(engine.stream(prompt, 2, session, first, 1))
    arrived = asyncio.create_task(first.wait())
    await asyncio.wait((streaming, arrived), return_when=asyncio.FIRST_COMPLETED)
    client_s = time.perf_counter() - sent_s
    arrived.cancel()
    await streaming  # a failed stream raises here, before its time is used
    (after,) = await settled(engine.client, [before], TIME_TO_FIRST_TOKEN, 1, settle_timeout_s)
    scale = after.value(TIME_SCALE) or 1.0
    return OverheadPoint(client_s / scale, delta(before, after, TIME_TO_FIRST_TOKEN).sum)
