"""The decode batches the routers read (``WorkerView.batch_size``,
``context_tokens``, ``min_itl_slack_s``), as the coordinators see them: each
replica knows the rounds it streams, and reports per decode worker what it
streams from it every ``REPORT_INTERVAL_S``; a view sums the replicas' fresh
reports (docs/SERVING.md, "Decode batches"). The simulator's decode worker
gives the policies the same three figures from its own batch.

A sequence is in the batch from its round's first token to its last, as in the
simulator (a local prefill before its first token is the worker's queue). Its
ITL slack, mean scope, is its session's slack after its finished rounds
(``SessionState.itl_slack_s``) plus the ITL threshold times this round's token
gaps minus their sum, as of its last token.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from ampd.serve.replica.context import ReplicaContext
from ampd.serve.rounds.round import LiveRound
from ampd.serve.state.store import BatchReport

# [our choice] wall seconds; the ITL window's flush period (measure.ITL_FLUSH_S): a report
# is at most one period old, a few tokens at the ITLs served here.
REPORT_INTERVAL_S = 0.1
# [our choice] wall seconds: a report older than this is from a replica that stopped (or
# lost the store); ten missed periods, so a starved replica's report is not dropped early.
REPORT_MAX_AGE_S = 1.0
# [our choice] wall seconds: a replica removes, every this often, the reports of replicas
# silent for STALE_REPORT_AGE_S (stopped or crashed: a replica that leaves a worker reports
# it empty, and a live one reports every period). Without it each restart (a new replica id)
# would leave a field in every decode engine's hash that each snapshot reads for good.
DROP_INTERVAL_S = 10.0
STALE_REPORT_AGE_S = 60.0


def round_slack_s(live: LiveRound, itl_threshold_s: float) -> float:
    """The ITL slack of ``live``'s session after its tokens so far (module
    docstring), seconds; its slack before the round when no token came yet."""
    trace = live.trace
    if trace.first_token_s is None:
        return live.state.itl_slack_s
    gaps_s = trace.last_token_s - trace.first_token_s
    return live.state.itl_slack_s + itl_threshold_s * (trace.num_tokens - 1) - gaps_s


def batch_report(rounds: Iterable[LiveRound], itl_threshold_s: float | None, now_s: float) -> BatchReport:
    """What ``rounds`` (streaming from one decode worker) add to its batch:
    their count, KV tokens (prompt and output so far) and, with a threshold, the
    smallest slack."""
    rounds = list(rounds)
    context_tokens = sum(len(r.request.prompt) + r.trace.num_tokens for r in rounds)
    slack_s = None
    if itl_threshold_s is not None and rounds:
        slack_s = min(round_slack_s(r, itl_threshold_s) for r in rounds)
    return BatchReport(len(rounds), context_tokens, slack_s, now_s)


def merged(reports: Mapping[str, BatchReport], now_s: float, max_age_s: float) -> BatchReport:
    """The batch of one decode worker from its replicas' reports no older than
    ``max_age_s`` (model seconds): sizes and KV summed, the smallest slack."""
    fresh = [r for r in reports.values() if now_s - r.as_of_s <= max_age_s and r.batch_size]
    slacks = [r.min_itl_slack_s for r in fresh if r.min_itl_slack_s is not None]
    return BatchReport(sum(r.batch_size for r in fresh), sum(r.context_tokens for r in fresh),
                       min(slacks, default=None), now_s)


class DecodeBatches:
    """The rounds this replica streams, by decode worker, and their reports.

    Args:
        ctx: the replica's shared parts.
        itl_threshold_s: the ITL threshold slack is kept against (mean scope), or
            None: no slack (strict scope), sizes and KV only.
    """

    def __init__(self, ctx: ReplicaContext, itl_threshold_s: float | None) -> None:
        self.ctx, self.itl_threshold_s = ctx, itl_threshold_s
        self._streaming: dict[int, dict[str, LiveRound]] = {}
        self._reported: set[int] = set()  # workers whose last report was not empty

    def joined(self, live: LiveRound) -> None:
        """``live`` streams tokens from its decode worker from now on."""
        self._streaming.setdefault(live.trace.decode_worker, {})[live.task.session_id] = live

    def left(self, live: LiveRound) -> None:
        """``live`` stopped streaming from its decode worker (done, failed or moved)."""
        self._streaming.get(live.trace.decode_worker, {}).pop(live.task.session_id, None)

    def slack_after(self, live: LiveRound) -> float:
        """The session's ITL slack to keep after this round (0 where not kept)."""
        return 0.0 if self.itl_threshold_s is None else round_slack_s(live, self.itl_threshold_s)

    async def report_loop(self) -> None:
        """Report every worker this replica streams from (and, once, each it
        stopped streaming from), forever."""
        while True:
            await asyncio.sleep(REPORT_INTERVAL_S)
            await self.report()

    async def drop_loop(self) -> None:
        """Drop stopped replicas' reports every ``DROP_INTERVAL_S``, forever."""
        while True:
            await asyncio.sleep(DROP_INTERVAL_S)
            await self.drop_stale()

    async def drop_stale(self) -> int:
        """Remove every decode worker's reports older than ``STALE_REPORT_AGE_S``;
        how many were removed (0 when the store did not answer)."""
        before_s = self.ctx.clock.now_s() - self.ctx.clock.model_s(STALE_REPORT_AGE_S)
        dropped = 0
        for worker_id in self.ctx.decode_ids:
            dropped += await self.ctx.store_call(self.ctx.store.drop_batch_reports(worker_id, before_s)) or 0
            if not self.ctx.store_ok:  # tried again next interval
                break
        return dropped

    async def report(self) -> None:
        """One round of reports (``report_loop``)."""
        now_s = self.ctx.clock.now_s()
        streaming = {w: rounds for w, rounds in self._streaming.items() if rounds}
        for worker_id in sorted(streaming.keys() | self._reported):
            rounds = streaming.get(worker_id, {}).values()
            report = batch_report(rounds, self.itl_threshold_s, now_s)
            await self.ctx.store_call(self.ctx.store.report_batch(worker_id, self.ctx.options.replica_id, report))
            if not self.ctx.store_ok:  # tried again next period
                return
            if report.batch_size:
                self._reported.add(worker_id)
            else:
                self._reported.discard(worker_id)
