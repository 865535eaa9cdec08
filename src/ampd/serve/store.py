"""Shared serving state: what coordinator replicas must agree on (the worker
registry, session bindings, per-worker prefill queues, windowed statistics,
dispatch leases) and the ``StateStore`` interface that holds it, in one
process (``MemoryStore``) or in Redis (``RedisStore``).

Times are model seconds from the replicas' common ``ScaledClock``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from ampd.core.deployment import Role, WorkerSpec
from ampd.core.errors import AmpdError
from ampd.core.task import PrefillTask
from ampd.core.view import QueuedTask


class StoreUnavailable(AmpdError):
    """The shared store cannot be reached; the caller degrades (docs/SERVING.md)."""


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One engine in the registry.

    Attributes:
        spec: id, role, TP and server of the worker.
        url: base URL of its OpenAI-compatible engine server.
        kind: ``"mock"`` or ``"vllm"`` (what it can do: docs/SERVING.md).
    """

    spec: WorkerSpec
    url: str
    kind: str = "mock"

    def to_json(self) -> str:
        s = self.spec
        return json.dumps({"worker_id": s.worker_id, "role": s.role.value, "tp": s.tp, "server": s.server,
                           "url": self.url, "kind": self.kind})

    @classmethod
    def from_json(cls, text: str) -> WorkerInfo:
        d = json.loads(text)
        return cls(WorkerSpec(d["worker_id"], Role(d["role"]), d["tp"], d["server"]), d["url"], d["kind"])


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """A prefill task queued at (or dispatched to) one worker.

    Attributes:
        queued: the task, its enqueue time and predicted cost on that worker;
            ``postponements`` is kept by the store beside the entry.
        owner: id of the coordinator replica holding the client's request, to
            which the prefill's result is published.
        dispatch_s: when it was sent to the engine (None while waiting).
    """

    queued: QueuedTask
    owner: str
    dispatch_s: float | None = None

    @property
    def key(self) -> str:
        """``<session id>#<round index>``: unique per task."""
        return task_key(self.queued.task.session_id, self.queued.task.round_index)

    def to_json(self) -> str:
        """The entry without its postponement counter (kept apart, so the text
        stays the same while it waits)."""
        t, q = self.queued.task, self.queued
        return json.dumps([t.session_id, t.round_index, t.hist_tokens, t.new_tokens, t.ready_s, t.decode_worker,
                           q.enqueue_s, q.cost_s, self.owner, self.dispatch_s])

    @classmethod
    def from_json(cls, text: str, postponements: int = 0) -> QueueEntry:
        return cls.from_list(json.loads(text), postponements)

    @classmethod
    def from_list(cls, values: list, postponements: int = 0) -> QueueEntry:
        """From the decoded JSON array of ``to_json``."""
        sid, rnd, hist, new, ready_s, dw, enq_s, cost_s, owner, dispatch_s = values
        task = PrefillTask(sid, rnd, hist, new, ready_s, dw)
        return cls(QueuedTask(task, enq_s, cost_s, postponements), owner, dispatch_s)


BOUND, TAKEN, FULL = "bound", "taken", "full"


def task_key(session_id: str, round_index: int) -> str:
    """The key of a round's prefill task."""
    return f"{session_id}#{round_index}"


@dataclass(slots=True)
class WorkerState:
    """One worker as the store holds it.

    Attributes:
        worker_id: the worker.
        alive: False once marked dead (health check or failed call).
        queue: waiting prefill tasks, queue order (prefill workers).
        inflight: dispatched prefills not yet finished (prefill workers), or
            local prefills not yet at their first token (decode workers).
        ttft_mean_s, itl_mean_s: windowed mean TTFT (prefill workers) and ITL
            (decode workers), None when the window is empty.
        kv_used_tokens: KV reserved by the sessions bound to it (decode workers).
    """

    worker_id: int
    alive: bool = True
    queue: list[QueueEntry] = field(default_factory=list)
    inflight: list[QueueEntry] = field(default_factory=list)
    ttft_mean_s: float | None = None
    itl_mean_s: float | None = None
    kv_used_tokens: int = 0


@dataclass(frozen=True, slots=True)
class SessionState:
    """A session's binding.

    Attributes:
        decode_worker: the decode worker holding its KV.
        held_tokens: KV tokens of its finished rounds (prompt + output of the last one).
        reserved_tokens: KV tokens counted against the worker's memory for it.
        num_rounds: rounds started so far.
        last_s: when it last started or finished a round.
    """

    decode_worker: int
    held_tokens: int = 0
    reserved_tokens: int = 0
    num_rounds: int = 0
    last_s: float = 0.0

    def to_json(self) -> str:
        return json.dumps([self.decode_worker, self.held_tokens, self.reserved_tokens, self.num_rounds, self.last_s])

    @classmethod
    def from_json(cls, text: str) -> SessionState:
        return cls(*json.loads(text))


ResultHandler = Callable[[dict], Awaitable[None] | None]


class StateStore(Protocol):
    """Shared state of the coordinator replicas. Every method may raise
    ``StoreUnavailable``. Implementations: ``MemoryStore``, ``RedisStore``;
    both take the statistics' window length, seconds, when built."""

    async def ping(self) -> None:
        """Raise ``StoreUnavailable`` unless the store answers."""

    async def register_workers(self, workers: list[WorkerInfo]) -> None:
        """Add (or replace) registry entries; registering marks a worker alive."""

    async def workers(self) -> list[WorkerInfo]:
        """The registry, in worker id order."""

    async def snapshot(self, worker_ids: list[int], now_s: float) -> list[WorkerState]:
        """The state of ``worker_ids`` now (windows end at ``now_s``), in one round trip."""

    async def set_alive(self, worker_id: int, alive: bool) -> None:
        """Mark a worker alive or dead."""

    async def get_session(self, session_id: str) -> SessionState | None:
        """The session's binding, or None when unbound."""

    async def bind_session(self, session_id: str, state: SessionState, capacity_tokens: int) -> str:
        """Bind a new session and reserve its tokens on its worker, checking in the
        same step that the worker's reservations stay within ``capacity_tokens``.
        ``BOUND``; or, with nothing changed, ``TAKEN`` (another replica bound it
        first) or ``FULL`` (the worker filled up since it was chosen)."""

    async def update_session(self, session_id: str, old: SessionState, new: SessionState) -> None:
        """Replace a binding; the workers' reserved KV moves by the difference."""

    async def end_session(self, session_id: str) -> None:
        """Drop a binding and free its reserved KV (no-op when unbound)."""

    async def expire_sessions(self, idle_before_s: float) -> list[str]:
        """End the sessions whose last round started or finished before
        ``idle_before_s`` (freeing their reserved KV); their ids."""

    async def push(self, worker_id: int, entry: QueueEntry, payload: str) -> None:
        """Append a task (and the request body to send, ``payload``) to a worker's queue."""

    async def set_postponements(self, worker_id: int, counts: dict[str, int]) -> None:
        """Store Algorithm 2's postponement counters by task key."""

    async def take(self, worker_id: int, entry: QueueEntry, dispatch_s: float) -> tuple[QueueEntry, str] | None:
        """Move a waiting task (``entry`` as a snapshot or ``push`` gave it) to the
        worker's in-flight set; its in-flight entry and payload, or None when it is
        no longer queued (withdrawn, or taken by another replica)."""

    async def withdraw(self, worker_id: int, entry: QueueEntry) -> bool:
        """Remove a waiting task; False when it was not waiting (already dispatched)."""

    async def add_inflight(self, worker_id: int, entry: QueueEntry) -> None:
        """Record a task running on a worker (a local prefill sent to a decode engine)."""

    async def remove_inflight(self, worker_id: int, key: str) -> None:
        """Forget a finished (or failed) in-flight task."""

    async def add_samples(self, worker_id: int, kind: str, now_s: float, total_s: float, count: int) -> None:
        """Add ``count`` latency samples summing to ``total_s`` to a worker's
        ``kind`` window (``"ttft"`` or ``"itl"``)."""

    async def acquire_lease(self, worker_id: int, owner: str, ttl_s: float) -> bool:
        """Take the right to dispatch a worker's queue for ``ttl_s`` wall seconds;
        False when another owner holds it."""

    async def release_lease(self, worker_id: int, owner: str) -> None:
        """Give the lease back if ``owner`` holds it."""

    async def publish(self, owner: str, message: dict) -> None:
        """Deliver ``message`` to replica ``owner``'s result handler."""

    async def subscribe(self, owner: str, handler: ResultHandler) -> None:
        """Deliver the messages published to ``owner`` to ``handler`` until ``close``."""

    async def close(self) -> None:
        """Release connections and background tasks."""
