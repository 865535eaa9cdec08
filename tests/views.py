"""Hand-made cluster views for policy tests."""

from ampd.core import ClusterView, PrefillTask, QueuedTask, Role, WorkerSpec, WorkerView


def task(session_id="t", hist=1000, new=500, ready_s=0.0, decode_worker=0, round_index=1) -> PrefillTask:
    return PrefillTask(session_id, round_index, hist, new, ready_s, decode_worker)


def queued(cost_s: float, ready_s: float = 0.0, postponements: int = 0, name: str = "q") -> QueuedTask:
    return QueuedTask(task(name, ready_s=ready_s), ready_s, cost_s, postponements)


def decode(worker_id=0, itl=None, queue=(), free=1000, server=0, capacity=None, tp=4) -> WorkerView:
    """A decode worker with ``free`` KV tokens of ``capacity`` (default: all free)."""
    capacity = free if capacity is None else capacity
    return WorkerView(WorkerSpec(worker_id, Role.DECODE, tp, server), tuple(queue), 0.0, None, itl, capacity,
                      capacity - free)


def prefill(worker_id, ttft=None, busy_s=0.0, queue=(), server=0) -> WorkerView:
    return WorkerView(WorkerSpec(worker_id, Role.PREFILL, 2, server), tuple(queue), busy_s, ttft, None)


def view(*workers: WorkerView) -> ClusterView:
    return ClusterView(tuple(sorted(workers, key=lambda w: w.worker_id)))
