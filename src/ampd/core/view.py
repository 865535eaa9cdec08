"""The read-only cluster snapshot a policy decides from (DESIGN.md section 4).

Built by the simulator from its state and by the coordinator from its shared
store; policies never see anything else.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampd.core.deployment import Role, WorkerSpec
from ampd.core.task import PrefillTask


@dataclass(frozen=True, slots=True)
class QueuedTask:
    """A prefill task waiting in one worker's queue.

    Attributes:
        task: the prefill task.
        enqueue_s: when it entered this queue.
        cost_s: predicted execution time on this worker (``T_pre`` at its TP).
        postponements: times a reorder has moved it later (Algorithm 2's counter).
        chunk_tokens: prefill tokens per mixed step a router chose for this local
            prefill (``ampd-slo``), or None: the decode engine's own budget.
    """

    task: PrefillTask
    enqueue_s: float
    cost_s: float
    postponements: int = 0
    chunk_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What a policy may read about one worker.

    Attributes:
        spec: identity, role, TP and server.
        queue: waiting prefill tasks in queue order.
        busy_s: predicted time until the work in progress ends (0 when idle).
        windowed_ttft_s: mean TTFT of the prefills this worker finished in the
            sliding window, or None when it finished none.
        windowed_itl_s: mean ITL this (decode) worker delivered in the window, or None.
        kv_capacity_tokens: KV tokens the worker can hold (decode workers).
        kv_used_tokens: KV tokens held or reserved by its bound sessions.
        reads_history: True when a remote prefill on this (prefill) worker reads
            the session's history KV from the decode worker; False when the
            engine recomputes the history instead (vLLM's prefill servers,
            docs/SERVING.md): the cost model then charges that recompute.
        batch_size: sequences decoding on this (decode) worker, those about to
            join its next step included (the coordinator: the rounds streaming
            from it, ``ampd.serve.rounds.decode_batch``).
        context_tokens: KV tokens those sequences hold.
        min_itl_slack_s: the smallest ITL slack among the sessions decoding on
            this (decode) worker, seconds, mean scope: a session's ITL threshold
            times the token gaps it has had (every round so far) minus the sum of
            those gaps; negative when it is over budget. None when unknown (no
            sequence decoding, or the strict scope).
    """

    spec: WorkerSpec
    queue: tuple[QueuedTask, ...] = ()
    busy_s: float = 0.0
    windowed_ttft_s: float | None = None
    windowed_itl_s: float | None = None
    kv_capacity_tokens: int = 0
    kv_used_tokens: int = 0
    reads_history: bool = True
    batch_size: int = 0
    context_tokens: int = 0
    min_itl_slack_s: float | None = None

    @property
    def worker_id(self) -> int:
        return self.spec.worker_id

    @property
    def kv_free_tokens(self) -> int:
        return self.kv_capacity_tokens - self.kv_used_tokens

    @property
    def queue_drain_s(self) -> float:
        """Predicted time to finish the work in progress and every queued task."""
        return self.busy_s + sum(q.cost_s for q in self.queue)


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The workers a policy may use (the simulator's: all of them; the
    coordinator's: the live ones), in worker id order."""

    workers: tuple[WorkerView, ...]

    def worker(self, worker_id: int) -> WorkerView:
        """The worker with id ``worker_id``.

        Raises:
            KeyError: no such worker in the view (unknown, or dead in serving).
        """
        if 0 <= worker_id < len(self.workers) and self.workers[worker_id].worker_id == worker_id:
            return self.workers[worker_id]
        for w in self.workers:
            if w.worker_id == worker_id:
                return w
        raise KeyError(f"worker {worker_id} is not in the cluster view")

    @property
    def prefill_workers(self) -> tuple[WorkerView, ...]:
        return tuple(w for w in self.workers if w.spec.role is Role.PREFILL)

    @property
    def decode_workers(self) -> tuple[WorkerView, ...]:
        return tuple(w for w in self.workers if w.spec.role is Role.DECODE)
