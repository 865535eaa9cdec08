"""A simulated decode worker: continuous batching, per-session KV across tool
calls, and prefills run locally on it (AMPD.md sections 3 and 3.1). With every
prefill routed locally it is also a colocated vLLM-style replica (AMPD.md
section 4's vLLM and vLLM-Continuum baselines)."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ampd.core.deployment import WorkerSpec
from ampd.core.task import PrefillTask
from ampd.core.view import QueuedTask, WorkerView
from ampd.metrics.records import RecordedItls, StepItls, StepLog
from ampd.perf.interface import PerfModel
from ampd.policy.batching import Batching, mixed_step_s
from ampd.policy.reorder import QueuePolicy, apply_order
from ampd.policy.window import SlidingWindowMean
from ampd.sim.engine import EventLoop
from ampd.sim.kv_cache import SessionKvCache
from ampd.sim.shared_host import stretched_step_s
from ampd.sim.sink import RoundSink

@dataclass(slots=True)
class _Sequence:
    """A round decoding on this worker: it joined at ``join_s`` with
    ``context_tokens`` of KV and decodes one token in each of the steps
    ``first_step`` to ``stop_step - 1`` (numbered as in the worker's ``StepLog``)."""

    session_id: str
    round_index: int
    remaining_tokens: int
    context_tokens: int
    join_s: float
    first_step: int = 0
    stop_step: int = 0

@dataclass(slots=True)
class _Chunking:
    """The prefill task being chunked and how many of its tokens are done."""

    head: QueuedTask
    done_tokens: int = 0


class SimDecodeWorker:
    """One decode replica.

    A prefill that runs alone pauses the batch: every running sequence's next token
    is delayed by exactly its time. A sequence whose first token arrives during a
    step joins at the next step. A chunked step costs
    ``ampd.policy.batching.mixed_step_s``, the formula the router and the planner
    estimate a local prefill with.

    ``on_step``, when given, hears the (session id, round index) of every
    sequence that got a token at the end of each step (the mock engine streams
    them); it makes a step O(batch).

    Cost: a step costs O(1) plus O(1) per sequence that joins or finishes in it,
    whatever the batch size: the batch is kept as running totals (size, context
    tokens), each sequence's last step is known when it joins (no preemption), and
    its ITLs are read off the worker's ``StepLog`` afterwards (``StepItls``).

    With ``neighbours_busy`` (the prefill engines computing on this worker's host, read
    at each step's start) and a perf model whose ``decode_step_factor_beside_prefill``
    exceeds 1, each step is stretched by the overlap (``ampd.sim.shared_host``): engines
    that share a host's compute slow each other. A local prefill that pauses the batch
    is not (its slowdown was not measured).

    With ``itl_slo_s`` the view reports the batch's smallest ITL slack
    (``WorkerView.min_itl_slack_s``, mean scope), kept in O(log batch) per
    sequence: a sequence that joined at ``join_s`` with slack ``base`` and had its
    first token gap in step ``j`` has, after step ``k``, the slack
    ``base + thr (k - j + 1) - (end_k - join_s)``, i.e. a constant of its own
    (``base + thr (1 - j) + join_s``) plus ``thr k - end_k``, the same for all; so
    the batch's minimum is the smallest constant (a heap) plus that term.
    """

    def __init__(self, spec: WorkerSpec, loop: EventLoop, perf: PerfModel, queue_policy: QueuePolicy,
                 sink: RoundSink, window_s: float, batching: Batching = Batching(),
                 kv_cache: SessionKvCache | None = None,
                 on_step: Callable[[Iterable[tuple[str, int]]], None] | None = None,
                 itl_slo_s: float | None = None,
                 neighbours_busy: Callable[[], Iterable[tuple[float, float]]] | None = None) -> None:
        self.spec, self.loop, self.perf, self.queue_policy, self.sink = spec, loop, perf, queue_policy, sink
        self.batching, self.on_step = batching, on_step
        self._step_factor = perf.decode_step_factor_beside_prefill
        self._neighbours_busy = neighbours_busy if self._step_factor > 1.0 else None
        self.kv = kv_cache or SessionKvCache(perf.kv_capacity_tokens(spec.tp))
        self.queue: list[QueuedTask] = []
        self.itl_window = SlidingWindowMean(window_s)
        self.steps = StepLog()
        self._step_ends = self.steps.ends_s
        self._joining: list[_Sequence] = []  # first token out, waiting for the next step
        self._step_joiners: list[_Sequence] = []  # joined the step in flight
        self._running: dict[tuple[str, int], _Sequence] = {}  # in the steps, in the order they joined
        self._finishing: dict[int, list[_Sequence]] = {}  # step index -> sequences whose last token it is
        self._batch_size = 0
        self._context_tokens = 0
        self._last_step_end_s = 0.0
        self._busy_until_s: float | None = None
        self._last_was_prefill = False
        self._chunking: _Chunking | None = None
        self._itl_slo_s = itl_slo_s
        self._slack_keys: list[tuple[float, str, int]] = []  # heap; entries of finished sequences linger
        self._slack_base: dict[str, float] = {}  # session -> slack at its last token

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv.capacity_tokens

    @property
    def batch_size(self) -> int:
        """Sequences decoding here, those waiting for the next step included."""
        return self._batch_size + len(self._joining)

    def enqueue_local(self, task: PrefillTask, chunk_tokens: int | None = None) -> None:
        """Queue a prefill routed here (local execution); a chunked engine runs it
        in steps of at most ``chunk_tokens`` prefill tokens when given."""
        cost_s = self.perf.prefill_s(task.hist_tokens, task.new_tokens, self.spec.tp)
        self.queue.append(QueuedTask(task, self.loop.now_s, cost_s, chunk_tokens=chunk_tokens))
        self._kick()

    def end_session(self, session_id: str) -> None:
        """The session's last round is over: free its KV and forget its slack."""
        self.kv.end_session(session_id)
        self._slack_base.pop(session_id, None)

    def join(self, task: PrefillTask, output_tokens: int) -> None:
        """The round's first token is out and its KV is here: decode the other
        ``output_tokens - 1`` tokens; the sink hears ``round_done`` with their ITLs."""
        seq = _Sequence(task.session_id, task.round_index, output_tokens - 1,
                        task.hist_tokens + task.new_tokens + 1, self.loop.now_s)
        if seq.remaining_tokens == 0:
            self.kv.end_round(seq.session_id, self.loop.now_s)
            self.sink.round_done(seq.session_id, seq.round_index, RecordedItls())
            return
        self._joining.append(seq)
        self._kick()

    def view(self, now_s: float) -> WorkerView:
        """Snapshot for the policies."""
        busy_s = max(0.0, self._busy_until_s - now_s) if self._busy_until_s is not None else 0.0
        # The task being chunked is still before its first token: it stays in the
        # queue the policies see, as in the coordinator's view of an engine.
        queue = (self._chunking.head, *self.queue) if self._chunking else tuple(self.queue)
        batch_size, context_tokens = self._batch()
        return WorkerView(self.spec, queue, busy_s, None, self.itl_window.mean(now_s),
                          self.kv.capacity_tokens, self.kv.used_tokens(now_s), batch_size=batch_size,
                          context_tokens=context_tokens, min_itl_slack_s=self._min_slack_s())

    def _min_slack_s(self) -> float | None:
        """The smallest ITL slack of the sequences decoding here, as of their last
        token (class docstring); None without a threshold or a sequence."""
        if self._itl_slo_s is None:
            return None
        keys = self._slack_keys
        if len(keys) > 2 * len(self._running) + 64:
            # Later joiners get smaller constants, so finished sequences sink and would
            # never reach the top to be popped: rebuild from the live ones now and then.
            keys[:] = [k for k in keys if (k[1], k[2]) in self._running]
            heapq.heapify(keys)
        while keys and (keys[0][1], keys[0][2]) not in self._running:
            heapq.heappop(keys)
        # Sequences whose first gap has not ended yet still have the slack they came with.
        waiting = [self._slack_base.get(s.session_id, 0.0) for s in (*self._joining, *self._step_joiners)]
        if keys:
            waiting.append(keys[0][0] + self._slack_since())
        return min(waiting, default=None)

    def _slack_since(self) -> float:
        """``thr k - end_k`` after the last step ``k`` (class docstring)."""
        ends = self._step_ends
        return self._itl_slo_s * (len(ends) - 1) - ends[-1]

    def _kick(self) -> None:
        if self._busy_until_s is not None:
            return
        decoding = self._batch_size > 0 or bool(self._joining)
        if self.batching.mode == "chunked":
            if self.queue or self._chunking or decoding:
                self._start_mixed_step()
            return
        prefill_turn = self.queue and (self.batching.mode == "prefill-first" or not decoding
                                       or not self._last_was_prefill)
        if prefill_turn:
            self._start_prefill()
        elif decoding:
            self._start_step(self._decode_s())

    def _dequeue(self) -> QueuedTask:
        decision = self.queue_policy.pick(self.queue, self.loop.now_s)
        self.queue = apply_order(self.queue, decision)
        return self.queue.pop(0)

    def _start_prefill(self) -> None:
        head = self._dequeue()
        self._last_was_prefill = True
        self._busy_until_s = self.loop.now_s + head.cost_s
        self.loop.at(self._busy_until_s, self._end_prefill, head.task)

    def _end_prefill(self, task: PrefillTask) -> None:
        self._busy_until_s = None
        self.sink.first_token(task, self.spec.worker_id, True)
        self._kick()

    def _admit_joining(self) -> None:
        """Sequences waiting for a step join the one starting now (numbered
        ``len(self.steps)``: a step is logged when it ends, one at a time)."""
        if not self._joining:
            return
        step = len(self._step_ends)
        for seq in self._joining:
            seq.first_step, seq.stop_step = step, step + seq.remaining_tokens
            self._finishing.setdefault(seq.stop_step - 1, []).append(seq)
            self._running[(seq.session_id, seq.round_index)] = seq
            self._batch_size += 1
            self._context_tokens += seq.context_tokens
        self._step_joiners, self._joining = self._joining, []

    def _batch(self) -> tuple[int, int]:
        """Size and KV context tokens of the batch as it will be once the joining
        sequences are in."""
        batch, context = self._batch_size, self._context_tokens
        if self._joining:
            batch += len(self._joining)
            context += sum(s.context_tokens for s in self._joining)
        return batch, context

    def _decode_s(self) -> float:
        """One decode step of the batch as it will be once the joining sequences are in."""
        return self.perf.decode_step_s(*self._batch(), self.spec.tp)

    def _start_step(self, step_s: float, chunk: int = 0) -> None:
        self._admit_joining()
        self._last_was_prefill = False
        now_s = self.loop.now_s
        if self._neighbours_busy is not None:
            step_s = stretched_step_s(now_s, step_s, self._neighbours_busy(), self._step_factor)
        self._busy_until_s = now_s + step_s
        self.loop.at(self._busy_until_s, self._end_step, self._batch_size, chunk)

    def _start_mixed_step(self) -> None:
        if self._chunking is None and self.queue:
            self._chunking = _Chunking(self._dequeue())
        batch, context = self._batch()
        chunk = 0
        if self._chunking is not None:
            task, done = self._chunking.head.task, self._chunking.done_tokens
            chunk = self.batching.chunk(task.new_tokens - done, batch)
            if self._chunking.head.chunk_tokens is not None:
                chunk = min(chunk, self._chunking.head.chunk_tokens)
        if chunk:
            step_s = mixed_step_s(self.perf, self.spec.tp, task.hist_tokens + done, chunk, batch, context)
        else:
            step_s = self.perf.decode_step_s(batch, context, self.spec.tp)
        self._start_step(step_s, chunk)

    def _end_step(self, batch_size: int, chunk: int) -> None:
        """Every sequence of the step has one more token; state is settled before
        any callback runs, since the sink may start work on this worker."""
        finished = self._emit_tokens(batch_size) if batch_size else ()
        prefilled = None
        if chunk:
            self._chunking.done_tokens += chunk
            if self._chunking.done_tokens == self._chunking.head.task.new_tokens:
                prefilled, self._chunking = self._chunking.head.task, None
        self._busy_until_s = None
        for seq in finished:
            self.kv.end_round(seq.session_id, self.loop.now_s)
            self.sink.round_done(seq.session_id, seq.round_index,
                                 StepItls(seq.join_s, self.steps, seq.first_step, seq.stop_step))
        if prefilled is not None:
            self.sink.first_token(prefilled, self.spec.worker_id, True)
        self._kick()

    def _emit_tokens(self, batch_size: int) -> Sequence[_Sequence]:
        """Log the step, feed the ITL window (sequences in the previous step waited
        since its end, those that joined since they joined) and take out the
        sequences whose last token this was."""
        now_s = self.loop.now_s
        step = len(self._step_ends)
        self._step_ends.append(now_s)
        joiners = self._step_joiners
        continuing = batch_size - len(joiners)
        if continuing:
            self.itl_window.add(now_s, now_s - self._last_step_end_s, continuing)
        if joiners:
            for seq in joiners:
                self.itl_window.add(now_s, now_s - seq.join_s)
                if self._itl_slo_s is not None:
                    key = self._slack_base.get(seq.session_id, 0.0) + self._itl_slo_s * (1 - step) + seq.join_s
                    heapq.heappush(self._slack_keys, (key, seq.session_id, seq.round_index))
            self._step_joiners = []
        self._last_step_end_s = now_s
        self._context_tokens += batch_size
        if self.on_step is not None:
            self.on_step(self._running)
        finished = self._finishing.pop(step, ())
        for seq in finished:
            if self._itl_slo_s is not None:
                self._slack_base[seq.session_id] = (self._slack_base.get(seq.session_id, 0.0)
                                                    + self._itl_slo_s * (step - seq.first_step + 1)
                                                    - (now_s - seq.join_s))
            del self._running[(seq.session_id, seq.round_index)]
            self._batch_size -= 1
            self._context_tokens -= seq.context_tokens + seq.stop_step - seq.first_step
        return finished
