"""The windowed statistics Algorithm 1 reads, as a replica measures them: each
remote round's TTFT goes to its prefill worker's window at its first token;
every gap between streamed tokens to its decode worker's ITL window, gathered
and written every ``ITL_FLUSH_S`` (one store call per decode worker, not one
per token)."""

from __future__ import annotations

import asyncio

from ampd.serve.replica.context import ReplicaContext
from ampd.serve.rounds.phases import phases_s
from ampd.serve.rounds.round import RoundTrace

ITL_FLUSH_S = 0.1  # [our choice] wall seconds: windows are 1 s buckets, so 0.1 s late is within one


class LatencyWindows:
    """TTFT and ITL samples of the rounds this replica streams."""

    def __init__(self, ctx: ReplicaContext) -> None:
        self.ctx = ctx
        self._itl: dict[int, list[float]] = {}  # decode worker -> [sum of gaps s, count]

    async def first_token(self, trace: RoundTrace, count: int) -> None:
        """The round's first chunk (it may carry several tokens: the ones after the
        first count as ITL gaps of 0)."""
        now_s = self.ctx.clock.now_s()
        trace.first_token_s = trace.last_token_s = now_s
        trace.num_tokens = count
        if count > 1:
            self._itl.setdefault(trace.decode_worker, [0.0, 0])[1] += count - 1
        ttft_s = now_s - trace.ready_s
        self.ctx.metrics.ttft.observe(ttft_s)
        route, phases = phases_s(trace, now_s)
        for phase, seconds in phases.items():
            self.ctx.metrics.round_phase.labels(route, phase).observe(seconds)
        if not trace.local:
            await self.ctx.store_call(self.ctx.store.add_samples(trace.prefill_worker, "ttft", now_s, ttft_s, 1))

    def later_tokens(self, trace: RoundTrace, count: int) -> None:
        """A later chunk of ``count`` tokens: one gap since the last, then zeros."""
        now_s = self.ctx.clock.now_s()
        gap_s = now_s - trace.last_token_s
        trace.last_token_s = now_s
        trace.num_tokens += count
        self.ctx.metrics.itl.observe(gap_s)
        sums = self._itl.setdefault(trace.decode_worker, [0.0, 0])
        sums[0] += gap_s
        sums[1] += count

    async def flush_loop(self) -> None:
        """Write the ITL samples gathered since the last flush, forever."""
        while True:
            await asyncio.sleep(ITL_FLUSH_S)
            now_s = self.ctx.clock.now_s()
            pending, self._itl = self._itl, {}
            for worker_id, (total_s, count) in pending.items():
                await self.ctx.store_call(self.ctx.store.add_samples(worker_id, "itl", now_s, total_s, count))
