"""A steady decode batch kept streaming on an engine while other probes run: the load a
decode engine carries while serving makes one session's remote round (the other
sessions' tokens). ``ampd profile`` times a remote round's requests and a request's
serving path under it (``ProfileGrid.serving_load_batch``; docs/PROFILING.md, "Under a
decode load"), since measured on an idle engine they came out shorter than the same
requests under serving (``bench/results/vllm_contention.json``, condition ``decode-busy``).

A probe counts only when it ran wholly inside one batch's streaming: every stream of the
batch had its first tokens before the probe began, so the engine's first-token counter
gains nothing from the batch while the probe reads it, and the batch was still streaming
when the probe ended (the next batch's warm-up requests, which do add first tokens,
come after). A probe that straddled two batches, or failed, is run again.

The load ends by finishing its batch, not by aborting it, and then waits for the engine
to have counted every request finished through it and through the handles the probes
used: a probe after the load reads its own requests alone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from ampd.profile.decode_probe import warm_batch
from ampd.profile.engine import ProbedEngine
from ampd.profile.scrape import DECODE_TIME, ProbeError, scrape, settled

T = TypeVar("T")

# [our choice] A stream counts as streaming once 8 tokens have come: past its first token
# (the one the engine's first-token counter records) with a few steps to spare.
STARTED_TOKENS = 8
# [our choice] Runs of a probe before giving up: one straddling two batches is rare when
# a batch streams for seconds and a probe takes a fraction of one (ProfileGrid's sizes).
PROBE_TRIES = 5
# [our choice] How long the engine may take to count the load's last requests once they
# have ended: the probes' own wait for their counts (decode_probe).
SETTLE_TIMEOUT_S = 60.0


class DecodeLoad:
    """``batch_size`` streams of ``output_tokens`` on fresh ``prompt_tokens``-token prompts,
    a new batch as soon as one ends, on ``engine`` (a handle of its own, so the probes'
    prompts do not depend on how many batches ran).

    Attributes:
        batches: batches that ended so far.
    """

    def __init__(self, engine: ProbedEngine, batch_size: int, prompt_tokens: int, output_tokens: int) -> None:
        self.engine, self.batch_size = engine, batch_size
        self.prompt_tokens, self.output_tokens = prompt_tokens, output_tokens
        self.batches = 0
        self._streaming = asyncio.Event()
        self._failure: BaseException | None = None
        self._stopping = False

    async def _run(self) -> None:
        try:
            while not self._stopping:
                prompts = await warm_batch(self.engine, self.batch_size, self.prompt_tokens)
                started = [asyncio.Event() for _ in prompts]
                streams = [asyncio.create_task(self.engine.stream(p, self.output_tokens, s, e, STARTED_TOKENS))
                           for (p, s), e in zip(prompts, started)]
                try:
                    await asyncio.gather(*(e.wait() for e in started))
                    self._streaming.set()
                    await asyncio.gather(*streams)
                finally:
                    for task in streams:  # cancelled from outside, or one failed: none left behind
                        task.cancel()
                    self.batches += 1
                    self._streaming.clear()
        except Exception as exc:  # noqa: BLE001 -- whatever ended the load, the probes waiting on it must hear, not hang
            self._failure = exc
            self._streaming.set()

    async def inside(self, probe: Callable[[], Awaitable[T]]) -> T:
        """``probe()``'s result from a run inside one batch's streaming (module docstring).

        Raises:
            ProbeError: the load failed (its own requests, say), or ``PROBE_TRIES`` runs each
                straddled two batches or failed (the last failure's message).
        """
        last = "every run straddled two batches"
        for _ in range(PROBE_TRIES):
            await self._streaming.wait()
            if self._failure is not None:
                raise ProbeError(f"{self.engine.url}: the decode load failed: {self._failure}")
            batch = self.batches
            try:
                result = await probe()
            except ProbeError as exc:  # a reading that another batch's warm-up entered, say
                last = str(exc)
                continue
            if self.batches == batch and self._streaming.is_set():
                return result
        raise ProbeError(f"{self.engine.url}: no probe ran inside one batch of the decode load in {PROBE_TRIES} "
                         f"tries: {last}")

    @contextlib.asynccontextmanager
    async def running(self, *probing: ProbedEngine) -> AsyncIterator[DecodeLoad]:
        """The load runs inside the ``async with``; on leaving, its batch is finished and
        the engine's per-request counters have counted every request that finished
        through the load and through ``probing`` (the probes' handles on the same engine).

        Raises:
            ProbeError: on leaving, the engine counted more requests than finished through
                these handles (another client uses it), or not all of them in time.
        """
        handles = (self.engine, *probing)
        before = await scrape(self.engine.client, self.engine.url)
        finished = [h.finished_requests for h in handles]
        task = asyncio.create_task(self._run())
        try:
            yield self
        except BaseException:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise
        self._stopping = True
        await task
        self._stopping = False
        if self._failure is None:
            ended = sum(h.finished_requests - n for h, n in zip(handles, finished))
            await settled(self.engine.client, [before], DECODE_TIME, ended, SETTLE_TIMEOUT_S)
