"""A simulated prefill worker: a reordered queue, a lazy history read that overlaps
the previous task's compute, and only the new KV sent back (AMPD.md section 3,
step 3; DESIGN.md section 5); or, where a profile measured a remote round's engine
requests, those requests as serving sends them (docs/PROFILING.md)."""

from __future__ import annotations

from collections.abc import Callable

from ampd.core.deployment import WorkerSpec
from ampd.core.task import PrefillTask
from ampd.core.view import QueuedTask, WorkerView
from ampd.perf.interface import PerfModel, RemoteStages
from ampd.policy.reorder import QueuePolicy, apply_order
from ampd.policy.window import SlidingWindowMean
from ampd.sim.engine import EventLoop
from ampd.sim.sink import RoundSink


class SimPrefillWorker:
    """One prefill replica, a two-stage pipeline: read history, then compute
    (``perf.remote_stages_s``: the paper's KV read and ``T_pre``, or the engines'
    export and prefill requests as a profile measured them).

    A task is dequeued (and the queue reordered) only when the read stage is free
    and no fetched task is waiting, i.e. at most one task ahead of the one
    computing: the read is lazy, and it overlaps the compute in flight. Where the
    profile measured the engines' requests (``perf.measured_remote_path``) the
    export runs in the task's compute, as serving sends it from the worker's one
    slot, and a task is dequeued only once the worker is free. When the
    compute ends, the new KV (``new_tokens``) travels back to the decode worker;
    ``after_s`` after its arrival comes the round's first token. The windowed TTFT
    counts the rounds this worker prefilled, at the time their first token arrives.

    Args:
        decode_spec: maps a decode worker id to its spec (for transfer times).
        after_s: from a task's send stage to its first token, seconds: in
            ``SimCluster``, ``perf.round_paths_s``'s ``after_s`` (the decode engine's
            request and the serving stack's handoff, where they are not in the
            stages); 0 in a mock engine, whose requests are real. The queue policy counts it
            in each task's completion.
    """

    def __init__(self, spec: WorkerSpec, loop: EventLoop, perf: PerfModel, queue_policy: QueuePolicy,
                 sink: RoundSink, window_s: float, decode_spec: Callable[[int], WorkerSpec],
                 after_s: float = 0.0) -> None:
        self.spec, self.loop, self.perf, self.queue_policy, self.sink = spec, loop, perf, queue_policy, sink
        self.decode_spec, self.after_s = decode_spec, after_s
        self.queue: list[QueuedTask] = []
        self.ttft_window = SlidingWindowMean(window_s)
        self._fetching: QueuedTask | None = None
        self._fetched = False
        self._computing_until_s: float | None = None
        self._engine_from_s = 0.0
        self._lookahead = not perf.measured_remote_path(spec.tp)
        self._stages: dict[tuple[str, int], tuple[RemoteStages, float]] = {}  # and the export's lead

    def enqueue(self, task: PrefillTask, stages: RemoteStages | None = None) -> None:
        """Queue a prefill routed here (remote execution), timed by ``perf.remote_stages_s``
        (its compute led by ``perf.remote_export_s`` on the decode engine), or by
        ``stages`` when given: a task that is no remote round, whose compute is all this
        engine's (the mock engine's plain prefill)."""
        if stages is None:
            decode = self.decode_spec(task.decode_worker)
            stages = self.perf.remote_stages_s(task.hist_tokens, task.new_tokens, self.spec, decode)
            export_s = self.perf.remote_export_s(task.hist_tokens, self.spec, decode)
        else:
            export_s = 0.0
        self._stages[task.key] = (stages, export_s)
        self.queue.append(QueuedTask(task, self.loop.now_s, stages.compute_s))
        self._advance()

    def view(self, now_s: float) -> WorkerView:
        """Snapshot for the policies; ``busy_s`` counts the compute in flight and
        the task already fetched or being fetched."""
        busy_s = max(0.0, self._computing_until_s - now_s) if self._computing_until_s is not None else 0.0
        if self._fetching is not None:
            busy_s += self._fetching.cost_s
        return WorkerView(self.spec, tuple(self.queue), busy_s, self.ttft_window.mean(now_s), None)

    def _advance(self) -> None:
        if self._computing_until_s is None and self._fetching is not None and self._fetched:
            self._start_compute()
        if self._fetching is None and self.queue and (self._lookahead or self._computing_until_s is None):
            self._start_read()

    def _start_read(self) -> None:
        now_s = self.loop.now_s
        delay_s = max(0.0, self._computing_until_s - now_s) if self._computing_until_s is not None else 0.0
        # Every task's first token comes after_s after its KV: a delay the same for each
        decision = self.queue_policy.pick(self.queue, now_s, delay_s + self.after_s)
        self.queue = apply_order(self.queue, decision)
        self._fetching, self._fetched = self.queue.pop(0), False
        task = self._fetching.task
        self.loop.after(self._stages[task.key][0].read_s, self._end_read)

    def _end_read(self) -> None:
        self._fetched = True
        self._advance()

    @property
    def engine_busy_s(self) -> tuple[float, float] | None:
        """``(from_s, until_s)`` of the prefill engine's own work in the task computing
        now (the compute stage less a measured export's lead, ``perf.remote_export_s``),
        or None when it computes nothing: what slows a decode engine on its host
        (``ampd.sim.shared_host``)."""
        if self._computing_until_s is None:
            return None
        return self._engine_from_s, self._computing_until_s

    def _start_compute(self) -> None:
        head = self._fetching
        self._fetching, self._fetched = None, False
        now_s = self.loop.now_s
        self._computing_until_s = now_s + head.cost_s
        self._engine_from_s = now_s + self._stages[head.task.key][1]
        self.loop.at(self._computing_until_s, self._end_compute, head.task)

    def _end_compute(self, task: PrefillTask) -> None:
        self._computing_until_s = None
        self.loop.after(self._stages.pop(task.key)[0].send_s + self.after_s, self._deliver, task)
        self._advance()

    def _deliver(self, task: PrefillTask) -> None:
        self.ttft_window.add(self.loop.now_s, self.loop.now_s - task.ready_s)
        self.sink.first_token(task, self.spec.worker_id, False)
