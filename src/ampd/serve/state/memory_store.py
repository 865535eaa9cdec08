"""The shared state of a single-process coordinator (the embedded mode): the
``StateStore`` interface over plain dictionaries."""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections import defaultdict

from ampd.core.view import QueuedTask
from ampd.policy.window import SlidingWindowMean
from ampd.serve.state.store import (BOUND, BUSY, DONE, FORBIDDEN, FULL, LOST, MISSING, STARTED, TAKEN, BatchReport,
                              HistoryEntry, QueueEntry, ResultHandler, RoundStart, SessionState, WorkerInfo, WorkerState)


class MemoryStore:
    """``StateStore`` for one process: nothing is shared, every dispatch lease is
    granted to its caller, a published message goes straight to the subscribed
    handler. Windows are exact (``SlidingWindowMean``). Round leases expire on
    the monotonic clock. A worker's KV total changes only in ``_replace``, with
    the binding it counts, so it cannot drift."""

    def __init__(self, window_s: float = 10.0) -> None:
        self._workers: dict[int, WorkerInfo] = {}
        self._dead: set[int] = set()
        self._sessions: dict[str, SessionState] = {}
        self._round_leases: dict[str, tuple[str, float]] = {}  # session -> (lease, monotonic expiry)
        self._kv_used: dict[int, int] = defaultdict(int)
        self._queues: dict[int, list[tuple[QueueEntry, str]]] = defaultdict(list)
        self._postponements: dict[str, int] = {}
        self._inflight: dict[int, dict[str, QueueEntry]] = defaultdict(dict)
        self._windows: dict[tuple[int, str], SlidingWindowMean] = {}
        self._batches: dict[int, dict[str, BatchReport]] = defaultdict(dict)
        self._leases: dict[int, str] = {}
        self._handlers: dict[str, ResultHandler] = {}
        self._history: dict[str, list[HistoryEntry]] = {}  # prefix key -> entries, oldest first
        self._history_keys: dict[str, list[tuple[str, int]]] = {}  # session -> (key, round) of its entries, oldest first
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
                           self._kv_used[worker_id], dict(self._batches[worker_id]))

    def _with_postponements(self, entry: QueueEntry) -> QueueEntry:
        count = self._postponements.get(entry.key, 0)
        q = entry.queued
        return QueueEntry(QueuedTask(q.task, q.enqueue_s, q.cost_s, count), entry.owner, entry.dispatch_s)

    def _mean(self, worker_id: int, kind: str, now_s: float) -> float | None:
        window = self._windows.get((worker_id, kind))
        return window.mean(now_s) if window is not None else None

    async def set_alive(self, worker_id: int, alive: bool) -> None:
        (self._dead.discard if alive else self._dead.add)(worker_id)

    async def sessions(self) -> dict[str, SessionState]:
        return dict(self._sessions)

    def _holder(self, session_id: str) -> str | None:
        held = self._round_leases.get(session_id)
        if held is not None and held[1] <= time.monotonic():
            del self._round_leases[session_id]
            return None
        return held[0] if held is not None else None

    def _lease(self, session_id: str, lease: str, ttl_s: float) -> None:
        self._round_leases[session_id] = (lease, time.monotonic() + ttl_s)

    def _replace(self, session_id: str, state: SessionState | None) -> None:
        """The one place a binding changes: the worker totals move with it, and
        a session that ends leaves the prompt index."""
        old = self._sessions.pop(session_id, None)
        if old is not None:
            self._kv_used[old.decode_worker] -= old.reserved_tokens
        if state is not None:
            self._sessions[session_id] = state
            self._kv_used[state.decode_worker] += state.reserved_tokens
        else:
            self._unindex(session_id)

    def _unindex(self, session_id: str) -> None:
        for key in {key for key, _ in self._history_keys.pop(session_id, ())}:
            self._filter_history(key, lambda e: e.session_id != session_id)

    def _filter_history(self, key: str, keep) -> None:
        kept = [e for e in self._history.get(key, ()) if keep(e)]
        if kept:
            self._history[key] = kept
        else:
            self._history.pop(key, None)

    async def index_history(self, session_id: str, key: str, entry: HistoryEntry, max_entries_per_key: int,
                            max_entries_per_session: int, kept_to_round: int) -> bool:
        if session_id not in self._sessions:
            return False
        mine = self._history_keys.setdefault(session_id, [])
        for old_key, old_round in [pair for pair in mine if pair[1] > kept_to_round]:
            mine.remove((old_key, old_round))
            self._filter_history(old_key, lambda e: (e.session_id, e.round_index) != (session_id, old_round))
        for old_key in {k for k, _ in mine}:  # its earlier entries are its latest no more
            self._history[old_key] = [dataclasses.replace(e, latest=False) if e.session_id == session_id else e
                                      for e in self._history[old_key]]
        while len(mine) >= max_entries_per_session:
            old_key, old_round = mine.pop(0)
            self._filter_history(old_key, lambda e: (e.session_id, e.round_index) != (session_id, old_round))
        entries = self._history.setdefault(key, [])
        while len(entries) >= max_entries_per_key:
            gone = entries.pop(0)
            theirs = self._history_keys[gone.session_id]
            theirs.remove((key, gone.round_index))
            if not theirs:
                del self._history_keys[gone.session_id]
        entries.append(entry)
        self._history_keys.setdefault(session_id, mine).append((key, entry.round_index))
        return True

    async def history_entries(self, keys: list[str]) -> list[list[HistoryEntry]]:
        return [list(self._history.get(key, ())) for key in keys]

    async def bind_session(self, session_id: str, state: SessionState, capacity_tokens: int, lease: str,
                           lease_ttl_s: float) -> str:
        if session_id in self._sessions:
            return TAKEN
        if self._holder(session_id) not in (None, lease):
            return BUSY
        if self._kv_used[state.decode_worker] + state.reserved_tokens > capacity_tokens:
            return FULL
        self._replace(session_id, state)
        self._lease(session_id, lease, lease_ttl_s)
        return BOUND

    async def start_round(self, session_id: str, scope: str, lease: str, lease_ttl_s: float, need_tokens: int,
                          now_s: float) -> RoundStart:
        before = self._sessions.get(session_id)
        if before is None:
            return RoundStart(MISSING)
        if before.scope != scope:
            return RoundStart(FORBIDDEN)
        if self._holder(session_id) is not None:
            return RoundStart(BUSY)
        self._lease(session_id, lease, lease_ttl_s)
        after = dataclasses.replace(before, reserved_tokens=max(before.reserved_tokens, need_tokens),
                                    num_rounds=before.num_rounds + 1, last_s=now_s)
        self._replace(session_id, after)
        return RoundStart(STARTED, before, after)

    async def move_session(self, session_id: str, lease: str, state: SessionState, capacity_tokens: int,
                           lease_ttl_s: float) -> str:
        if self._superseded(session_id, lease, state.num_rounds):
            return LOST
        old = self._sessions.get(session_id)
        others = self._kv_used[state.decode_worker]
        if old is not None and old.decode_worker == state.decode_worker:
            others -= old.reserved_tokens
        if others + state.reserved_tokens > capacity_tokens:
            return FULL
        self._replace(session_id, state)
        self._lease(session_id, lease, lease_ttl_s)
        return DONE

    def _superseded(self, session_id: str, lease: str, num_rounds: int) -> bool:
        """Another lease holds the session, or a later round than ``num_rounds`` wrote it."""
        stored = self._sessions.get(session_id)
        return self._holder(session_id) not in (None, lease) or (stored is not None and stored.num_rounds > num_rounds)

    async def close_round(self, session_id: str, lease: str, state: SessionState | None, num_rounds: int) -> str:
        if self._superseded(session_id, lease, num_rounds):
            return LOST
        self._replace(session_id, state)
        self._round_leases.pop(session_id, None)
        return DONE

    async def renew_leases(self, leases: dict[str, str], lease_ttl_s: float) -> list[str]:
        lost = []
        for session_id, lease in leases.items():
            if self._holder(session_id) in (None, lease):
                self._lease(session_id, lease, lease_ttl_s)
            else:
                lost.append(session_id)
        return lost

    async def expire_sessions(self, idle_before_s: float) -> list[str]:
        idle = [sid for sid, state in self._sessions.items()
                if state.last_s < idle_before_s and self._holder(sid) is None]
        for sid in idle:
            self._replace(sid, None)
        return idle

    async def audit_kv(self, worker_ids: list[int]) -> dict[int, tuple[int, int]]:
        derived = dict.fromkeys(worker_ids, 0)
        for state in self._sessions.values():
            derived[state.decode_worker] = derived.get(state.decode_worker, 0) + state.reserved_tokens
        totals = {w: (self._kv_used[w], total) for w, total in derived.items()}
        self._kv_used.update(derived)
        return totals

    async def restore_sessions(self, states: dict[str, SessionState]) -> list[str]:
        written = []
        for session_id, state in states.items():
            old = self._sessions.get(session_id)
            if old is None or (old.num_rounds < state.num_rounds and self._holder(session_id) is None):
                self._replace(session_id, state)
                written.append(session_id)
        return written

    async def epoch(self) -> str:
        return "memory"  # the store lives and dies with its process: it never loses state under a replica

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

    async def report_batch(self, worker_id: int, replica_id: str, report: BatchReport) -> None:
        self._batches[worker_id][replica_id] = report

    async def drop_batch_reports(self, worker_id: int, before_s: float) -> int:
        reports = self._batches[worker_id]
        stale = [replica for replica, report in reports.items() if report.as_of_s < before_s]
        for replica in stale:
            del reports[replica]
        return len(stale)

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
