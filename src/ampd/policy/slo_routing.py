"""``ampd-slo``: prefill routing decided by each option's SLO outcome, with local
prefills chunked so the decode batch keeps its ITL budget (ours, **not the
paper's**; issue 12; docs/SIMULATOR.md, "SLO routing").

Two figures decide, for every option of a prefill task:

- its **predicted TTFT**: the time the round has already waited plus, remote,
  ``t_remote_i`` (queue drain, history read, prefill, new-KV return: what
  ``PredictiveRouter`` reads) or, local, the decode worker's queued local
  prefills and this one as the engine runs them (``local_prefill``);
- for local execution, its **ITL damage**: the sessions decoding on the bound
  worker each have an ITL slack (mean scope: threshold x their token gaps so far
  minus the gaps' sum; ``WorkerView.min_itl_slack_s``). A gap the prefill stretches
  to ``g`` seconds spends ``g - ITL threshold`` of it. The queued local prefills
  spend theirs first; a local prefill is allowed only if what is left covers its
  own, so no session in the batch is pushed past its mean-ITL budget.
  Under the mean scope a session also earns slack ahead: each of its next
  tokens, decoded at the batch's step time, adds ``threshold - step``. The
  slack counts the next ``slack_horizon_tokens`` of them (``SLACK_HORIZON_TOKENS``).

A local prefill runs in chunks (Kairos-style prefill deflection, AMPD.md
section 5): the largest chunk whose mixed steps (``mixed_step_s``) keep the
damage within the slack. Smaller chunks stretch each gap less and, as long as a
mixed step's fixed part stays under the threshold, spend less slack in all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ampd.core.task import PrefillTask
from ampd.core.view import ClusterView, WorkerView
from ampd.perf.interface import PerfModel
from ampd.policy.batching import Batching, LocalPrefill, local_prefill
from ampd.policy.decisions import RouteDecision
from ampd.policy.routing import SloThresholds, remote_estimate_s

SLACK_HORIZON_TOKENS = 32
"""Tokens ahead whose earned slack a decoding session is credited, mean scope.
[our choice] A session that just joined the batch has no slack yet, so without
a forecast the tightest session is nearly always a newcomer and every local
prefill is refused (development runs: Mixtral-8x7B / hotpotqa, 8 GPUs, 3.09 sessions/s,
attainment 85 % uncredited, 99.7 % with 32 tokens, 99.6 % with 100; 64 and 32
within a point in five other cells, docs/SIMULATOR.md). 32 is below every
workload's median round output (64-528 tokens, ``workload/specs.py``), so the
forecast holds for most rounds; it is not an oracle of the round's length."""

MIN_CHUNK_TOKENS = 32
"""Smallest chunk the search tries, tokens. [our choice] Below a few tens of
tokens a mixed step is its fixed costs (weights read, decode batch), so a smaller
chunk no longer shortens the gap; the floor also bounds the search to
``new_tokens / 32`` steps per evaluation."""


@dataclass(frozen=True, slots=True)
class LocalOption:
    """A local prefill as ``SloRouter`` weighs it.

    Attributes:
        ttft_s: predicted TTFT from the round's ``ready_s``, seconds.
        damage_s: ITL slack the queued local prefills and this one spend of the
            batch's tightest session, seconds (negative: the mixed steps are
            shorter than the threshold, so the session gains slack).
        chunk_tokens: prefill tokens per mixed step, or None when the engine
            pauses the batch (no chunks) or chooses them itself.
        safe: True when the damage fits in that session's slack.
    """

    ttft_s: float
    damage_s: float
    chunk_tokens: int | None
    safe: bool


def damage_s(prefill: LocalPrefill, decode_step_s: float, itl_threshold_s: float) -> float:
    """Mean-ITL slack ``prefill`` spends of a session decoding through it, seconds:
    each gap it touches lasts a decode step plus what the prefill adds to it
    (``LocalPrefill.added_s``), and spends that minus the ITL threshold."""
    return sum(decode_step_s + added_s - itl_threshold_s for added_s in prefill.added_s)


class SloRouter:
    """``ampd-slo``: remote when a prefill worker meets the TTFT SLO, else local
    when that meets it within the batch's ITL slack, else a chosen degradation.

    1. **remote**: the prefill worker with the smallest predicted TTFT (time
       waited + ``t_remote_i``; ties: lowest id) takes the task if that TTFT is at
       most ``alpha`` x the TTFT threshold. [our choice] Remote first: it spends
       no decode time, which the batch's throughput needs, and a remote prefill
       never touches a running session's ITL.
    2. **local**: else, if running it on the bound decode worker (in the largest
       chunk its batch's slack allows) is ITL-safe and its predicted TTFT is at
       most ``alpha`` x threshold.
    3. **degraded** (no option meets the TTFT SLO): the ITL-safe option with the
       smallest predicted TTFT (ties: local, then lowest id). [our choice] The
       round is late anyway; sacrificing other sessions' ITL for it would turn one
       late round into several missed sessions, while, under the mean scope, a
       late round costs its own session only its share of the mean TTFT. When no
       option is ITL-safe (no prefill worker and a batch without slack), local in
       the least damaging chunk.

    Slack known (mean scope), the batch is credited what it earns over its next
    ``slack_horizon_tokens`` tokens: ``(ITL threshold - decode step) x horizon``.
    Slack unknown (``min_itl_slack_s`` None: the coordinator's view, or the strict
    scope) reads 0, with no credit: the stretched gaps must then give back what
    they take beyond the threshold, close to Kairos's per-gap rule.

    Args:
        perf: cost functions.
        slo: the thresholds (TTFT for step 1-3, ITL for the slack).
        alpha: TTFT safety factor, AMPD's default 0.9 (the prediction ignores
            arrivals that reorder the queue ahead of the task).
        batching: the decode engines' batching (``ampd.policy.batching``); chunks
            are chosen only under ``chunked``.
        per_task_chunks: True when the decode engine runs each local prefill in
            the chunk the decision carries (the simulator's decode worker); False
            when its token budget is engine-wide (vLLM's
            ``max_num_batched_tokens``, served), so the estimate uses that budget
            and the decision carries none.
        slack_horizon_tokens: tokens ahead whose slack a session is credited
            (``SLACK_HORIZON_TOKENS``); 0 credits none.

    Raises (``route``):
        KeyError: the task's decode worker is not in the view.
    """

    def __init__(self, perf: PerfModel, slo: SloThresholds, alpha: float = 0.9, batching: Batching = Batching(),
                 per_task_chunks: bool = True, slack_horizon_tokens: int = SLACK_HORIZON_TOKENS) -> None:
        self.perf, self.slo, self.alpha = perf, slo, alpha
        self.batching, self.per_task_chunks = batching, per_task_chunks
        self.slack_horizon_tokens = slack_horizon_tokens

    def route(self, task: PrefillTask, view: ClusterView, now_s: float) -> RouteDecision:
        decode = view.worker(task.decode_worker)
        waited_s = now_s - task.ready_s
        target_s = self.alpha * self.slo.ttft_s
        remotes = sorted((waited_s + remote_estimate_s(task, decode, w, self.perf), w.worker_id)
                         for w in view.prefill_workers)
        if remotes and remotes[0][0] <= target_s:
            return self._decision(task, remotes[0][1], False, "slo-remote", remotes[0][0])
        local = self.local_option(task, decode, waited_s)
        options = ((decode.worker_id, local.ttft_s if local.safe else math.inf),
                   *((worker_id, ttft_s) for ttft_s, worker_id in remotes))
        if local.safe and local.ttft_s <= target_s:
            return self._decision(task, decode.worker_id, True, "slo-local", local.ttft_s, options, local)
        worker_id, ttft_s = min(options, key=lambda o: o[1])  # min keeps the first of equals: local
        if math.isinf(ttft_s):
            return self._decision(task, decode.worker_id, True, "slo-degraded", local.ttft_s, options, local)
        return self._decision(task, worker_id, worker_id == decode.worker_id, "slo-degraded", ttft_s, options, local)

    def local_option(self, task: PrefillTask, decode: WorkerView, waited_s: float) -> LocalOption:
        """The task run on its decode worker after the local prefills queued there:
        its predicted TTFT and the slack it spends, in the largest safe chunk
        (or, none being safe, the least damaging one)."""
        slack_s = self.slack_s(decode)
        ahead_ttft_s, ahead_damage_s = 0.0, 0.0
        for queued in decode.queue:
            ttft_s, spent_s = self._run(queued.task, decode, queued.chunk_tokens)
            ahead_ttft_s += ttft_s
            ahead_damage_s += spent_s
        left_s = slack_s - ahead_damage_s
        path_s = self.perf.round_paths_s(None, decode.spec.tp).before_s

        def option(chunk_tokens: int | None) -> LocalOption:
            ttft_s, spent_s = self._run(task, decode, chunk_tokens)
            ttft_s += waited_s + ahead_ttft_s + path_s
            return LocalOption(ttft_s, ahead_damage_s + spent_s,
                               chunk_tokens if self.per_task_chunks else None, spent_s <= left_s)

        largest = self._largest_chunk(task.new_tokens, decode.batch_size)
        if not largest:  # the engine pauses the batch, or the batch fills its budget
            return option(None)
        widest = option(largest)
        if widest.safe or not self.per_task_chunks:
            return widest
        narrowest = option(min(largest, MIN_CHUNK_TOKENS))
        if not narrowest.safe:
            return min(widest, narrowest, key=lambda o: o.damage_s)
        low, high = narrowest.chunk_tokens, largest  # safe at low, not at high
        best = narrowest
        while high - low > 1:
            mid = (low + high) // 2
            candidate = option(mid)
            if candidate.safe:
                low, best = mid, candidate
            else:
                high = mid
        return best

    def slack_s(self, decode: WorkerView) -> float:
        """The batch's tightest ITL slack with what it earns over the horizon,
        seconds (0 when not reported)."""
        if decode.min_itl_slack_s is None:
            return 0.0
        if not decode.batch_size:
            return decode.min_itl_slack_s
        step_s = self.perf.decode_step_s(decode.batch_size, decode.context_tokens, decode.spec.tp)
        return decode.min_itl_slack_s + self.slack_horizon_tokens * max(0.0, self.slo.itl_s - step_s)

    def _largest_chunk(self, new_tokens: int, batch_size: int) -> int | None:
        """The largest chunk the engine's budget leaves beside the batch (None when
        the engine does not chunk; 0 when the batch fills the budget)."""
        if not self.batching.chunked:
            return None
        return self.batching.chunk(new_tokens, batch_size)

    def _run(self, task: PrefillTask, decode: WorkerView, chunk_tokens: int | None) -> tuple[float, float]:
        """(TTFT from its start, slack spent) of ``task`` on ``decode``'s batch in
        chunks of ``chunk_tokens`` (None: the engine's batching as it is)."""
        # A budget of chunk + batch makes every step carry ``chunk_tokens`` of prefill, within
        # the engine's (a queued task's chunk was chosen beside a batch that may have grown).
        batching = self.batching
        if chunk_tokens is not None:
            batching = Batching("chunked", min(chunk_tokens + decode.batch_size, self.batching.chunk_tokens))
        tp = decode.spec.tp
        run = local_prefill(self.perf, tp, batching, task.hist_tokens, task.new_tokens, decode.batch_size,
                            decode.context_tokens)
        if math.isinf(run.ttft_s):
            return run.ttft_s, math.inf
        step_s = self.perf.decode_step_s(decode.batch_size, decode.context_tokens, tp) if decode.batch_size else 0.0
        return run.ttft_s, damage_s(run, step_s, self.slo.itl_s)

    @staticmethod
    def _decision(task: PrefillTask, worker_id: int, local: bool, rule: str, basis_s: float,
                  options: tuple[tuple[int, float], ...] = (), chosen: LocalOption | None = None) -> RouteDecision:
        chunk = chosen.chunk_tokens if local and chosen is not None else None
        return RouteDecision(task.session_id, task.round_index, worker_id, local, rule, basis_s, options, chunk)
