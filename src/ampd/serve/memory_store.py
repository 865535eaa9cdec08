"""The shared state of a single-process coordinator (the embedded mode): the
``StateStore`` interface over plain dictionaries."""

from __future__ import annotations

import inspect
from collections import defaultdict

from ampd.core.view import QueuedTask
from ampd.policy.window import SlidingWindowMean
from ampd.serve.store import BOUND, FULL, TAKEN, QueueEntry, ResultHandler, SessionState, WorkerInfo, WorkerState


class MemoryStore:
    """``StateStore`` for one process: nothing is shared, every lease is granted
    to its caller, a published message goes straight to the subscribed handler.
    Windows are exact (``SlidingWindowMean``)."""

    def __init__(self, window_s: float = 10.0) -> None:
        self._workers: dict[int, WorkerInfo] = {}
        self._dead: set[int] = set()
        self._sessions: dict[str, SessionState] = {}
        self._kv_used: dict[int, int] = defaultdict(int)
        self._queues: dict[int, list[tuple[QueueEntry, str]]] = defaultdict(list)
        self._postponements: dict[str, int] = {}
        self._inflight: dict[int, dict[str, QueueEntry]] = defaultdict(dict)
        self._windows: dict[tuple[int, str], SlidingWindowMean] = {}
        self._leases: dict[int, str] = {}
        self._handlers: dict[str, ResultHandler] = {}
        self._window_s = window_s

    async def ping(self) -> None:
        return None

    async def register_workers(self, workers: list[WorkerInfo]) -> None:
        for info in workers:
            self._workers[info.spec.worker_id] = info
            self._dead.discard(info.spec.worker_id)

    async def workers(self) -> list[WorkerInfo]:
        return [self._workers[i] for i in sorted(self._workers)]

    async def snapshot(self, worker_ids: list[int], now_s: float) -> list[WorkerState]:
        return [self._state(i, now_s) for i in worker_ids]

    def _state(self, worker_id: int, now_s: float) -> WorkerState:
        queue = [self._with_postponements(e) for e, _ in self._queues[worker_id]]
        return WorkerState(worker_id, worker_id not in self._dead, queue, list(self._inflight[worker_id].values()),
                           self._mean(worker_id, "ttft", now_s), self._mean(worker_id, "itl", now_s),
                           self._kv_used[worker_id])

    def _with_postponements(self, entry: QueueEntry) -> QueueEntry:
        count = self._postponements.get(entry.key, 0)
        q = entry.queued
        return QueueEntry(QueuedTask(q.task, q.enqueue_s, q.cost_s, count), entry.owner, entry.dispatch_s)

    def _mean(self, worker_id: int, kind: str, now_s: float) -> float | None:
        window = self._windows.get((worker_id, kind))
        return window.mean(now_s) if window is not None else None

    async def set_alive(self, worker_id: int, alive: bool) -> None:
        (self._dead.discard if alive else self._dead.add)(worker_id)

    async def get_session(self, session_id: str) -> SessionState | None:
        return self._sessions.get(session_id)

    async def bind_session(self, session_id: str, state: SessionState, capacity_tokens: int) -> str:
        if session_id in self._sessions:
            return TAKEN
        if self._kv_used[state.decode_worker] + state.reserved_tokens > capacity_tokens:
            return FULL
        self._sessions[session_id] = state
        self._kv_used[state.decode_worker] += state.reserved_tokens
        return BOUND

    async def update_session(self, session_id: str, old: SessionState, new: SessionState) -> None:
        self._kv_used[old.decode_worker] -= old.reserved_tokens
        self._kv_used[new.decode_worker] += new.reserved_tokens
        self._sessions[session_id] = new

    async def end_session(self, session_id: str) -> None:
        state = self._sessions.pop(session_id, None)
        if state is not None:
            self._kv_used[state.decode_worker] -= state.reserved_tokens

    async def expire_sessions(self, idle_before_s: float) -> list[str]:
        idle = [sid for sid, state in self._sessions.items() if state.last_s < idle_before_s]
        for sid in idle:
            await self.end_session(sid)
        return idle

    async def push(self, worker_id: int, entry: QueueEntry, payload: str) -> None:
        self._queues[worker_id].append((entry, payload))

    async def set_postponements(self, worker_id: int, counts: dict[str, int]) -> None:
        self._postponements.update(counts)

    async def take(self, worker_id: int, entry: QueueEntry, dispatch_s: float) -> tuple[QueueEntry, str] | None:
        key = entry.key
        found = self._pop(worker_id, key)
        if found is None:
            return None
        entry, payload = found
        entry = QueueEntry(self._with_postponements(entry).queued, entry.owner, dispatch_s)
        self._postponements.pop(key, None)
        self._inflight[worker_id][key] = entry
        return entry, payload

    def _pop(self, worker_id: int, key: str) -> tuple[QueueEntry, str] | None:
        queue = self._queues[worker_id]
        for i, (entry, _) in enumerate(queue):
            if entry.key == key:
                return queue.pop(i)
        return None

    async def withdraw(self, worker_id: int, entry: QueueEntry) -> bool:
        self._postponements.pop(entry.key, None)
        return self._pop(worker_id, entry.key) is not None

    async def add_inflight(self, worker_id: int, entry: QueueEntry) -> None:
        self._inflight[worker_id][entry.key] = entry

    async def remove_inflight(self, worker_id: int, key: str) -> None:
        self._inflight[worker_id].pop(key, None)

    async def add_samples(self, worker_id: int, kind: str, now_s: float, total_s: float, count: int) -> None:
        window = self._windows.setdefault((worker_id, kind), SlidingWindowMean(self._window_s))
        window.add(now_s, total_s / count, count)

    async def acquire_lease(self, worker_id: int, owner: str, ttl_s: float) -> bool:
        holder = self._leases.setdefault(worker_id, owner)
        return holder == owner

    async def release_lease(self, worker_id: int, owner: str) -> None:
        if self._leases.get(worker_id) == owner:
            del self._leases[worker_id]

    async def publish(self, owner: str, message: dict) -> None:
        handler = self._handlers.get(owner)
        if handler is not None:
            result = handler(message)
            if inspect.isawaitable(result):
                await result

    async def subscribe(self, owner: str, handler: ResultHandler) -> None:
        self._handlers[owner] = handler

    async def close(self) -> None:
        self._handlers.clear()
