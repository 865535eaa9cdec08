"""A simulated decode worker: continuous batching, resident KV across tool calls,
and local prefills that pause the batch (AMPD.md sections 3 and 3.1)."""

from __future__ import annotations

from dataclasses import dataclass

from ampd.core.deployment import WorkerSpec
from ampd.core.task import PrefillTask
from ampd.core.view import QueuedTask, WorkerView
from ampd.perf.interface import PerfModel
from ampd.policy.reorder import QueuePolicy, apply_order
from ampd.policy.window import SlidingWindowMean
from ampd.sim.engine import EventLoop
from ampd.sim.sink import RoundSink


@dataclass(slots=True)
class _Sequence:
    session_id: str
    round_index: int
    remaining_tokens: int
    context_tokens: int
    last_token_s: float
    itls_s: list[float]


class SimDecodeWorker:
    """One decode replica.

    Between two decode steps it runs at most one local prefill (the oldest by the
    queue policy), then goes back to decoding: a local prefill delays every
    running sequence's next token by exactly its prefill time, and a long local
    queue cannot starve the batch. [our choice; the paper only says that a local
    prefill interrupts the batch.] A sequence whose first token arrives during a
    step joins at the next step.

    KV memory is reserved per session: a round reserves its input and output
    tokens when it starts, and everything is released when the session ends.
    """

    def __init__(self, spec: WorkerSpec, loop: EventLoop, perf: PerfModel, queue_policy: QueuePolicy,
                 sink: RoundSink, window_s: float) -> None:
        self.spec, self.loop, self.perf, self.queue_policy, self.sink = spec, loop, perf, queue_policy, sink
        self.kv_capacity_tokens = perf.kv_capacity_tokens(spec.tp)
        self.kv_used_tokens = 0
        self.queue: list[QueuedTask] = []
        self.itl_window = SlidingWindowMean(window_s)
        self._batch: dict[tuple[str, int], _Sequence] = {}
        self._busy_until_s: float | None = None
        self._last_was_prefill = False

    def reserve(self, tokens: int) -> None:
        """Hold ``tokens`` of KV memory for a bound session's round."""
        self.kv_used_tokens += tokens

    def release(self, tokens: int) -> None:
        """Free the KV memory of a session that ended."""
        self.kv_used_tokens -= tokens

    def enqueue_local(self, task: PrefillTask) -> None:
        """Queue a prefill routed here (local execution)."""
        cost_s = self.perf.prefill_s(task.hist_tokens, task.new_tokens, self.spec.tp)
        self.queue.append(QueuedTask(task, self.loop.now_s, cost_s))
        self._kick()

    def join(self, task: PrefillTask, output_tokens: int, itls_s: list[float]) -> None:
        """The round's first token is out and its KV is here: decode the rest,
        appending the gap before each further token to ``itls_s``."""
        seq = _Sequence(task.session_id, task.round_index, output_tokens - 1,
                        task.hist_tokens + task.new_tokens + 1, self.loop.now_s, itls_s)
        if seq.remaining_tokens == 0:
            self.sink.round_done(task.session_id, task.round_index)
            return
        self._batch[(task.session_id, task.round_index)] = seq
        self._kick()

    def view(self, now_s: float) -> WorkerView:
        """Snapshot for the policies."""
        busy_s = max(0.0, self._busy_until_s - now_s) if self._busy_until_s is not None else 0.0
        return WorkerView(self.spec, tuple(self.queue), busy_s, None, self.itl_window.mean(now_s),
                          self.kv_capacity_tokens, self.kv_used_tokens)

    def _kick(self) -> None:
        if self._busy_until_s is not None:
            return
        prefill_turn = self.queue and (not self._batch or not self._last_was_prefill)
        if prefill_turn:
            self._start_prefill()
        elif self._batch:
            self._start_step()

    def _start_prefill(self) -> None:
        decision = self.queue_policy.pick(self.queue, self.loop.now_s)
        self.queue = apply_order(self.queue, decision)
        head = self.queue.pop(0)
        self._last_was_prefill = True
        self._busy_until_s = self.loop.now_s + head.cost_s
        self.loop.at(self._busy_until_s, self._end_prefill, head.task)

    def _end_prefill(self, task: PrefillTask) -> None:
        self._busy_until_s = None
        self.sink.first_token(task, self.spec.worker_id, True)
        self._kick()

    def _start_step(self) -> None:
        batch = list(self._batch.values())
        context_tokens = sum(s.context_tokens for s in batch)
        self._last_was_prefill = False
        self._busy_until_s = self.loop.now_s + self.perf.decode_step_s(len(batch), context_tokens, self.spec.tp)
        self.loop.at(self._busy_until_s, self._end_step, batch)

    def _end_step(self, batch: list[_Sequence]) -> None:
        now_s = self.loop.now_s
        self._busy_until_s = None
        for seq in batch:
            itl_s = now_s - seq.last_token_s
            self.itl_window.add(now_s, itl_s)
            seq.itls_s.append(itl_s)
            seq.last_token_s = now_s
            seq.remaining_tokens -= 1
            seq.context_tokens += 1
            if seq.remaining_tokens == 0:
                del self._batch[(seq.session_id, seq.round_index)]
                self.sink.round_done(seq.session_id, seq.round_index)
        self._kick()
