"""The shared state of coordinator replicas in Redis (standalone server; the
scripts touch keys they compute, which Redis Cluster would refuse).

Key layout and the Lua scripts: ``ampd.serve.state.redis_scripts``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import math
import uuid
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from ampd.core.view import QueuedTask
from ampd.serve.state.redis_scripts import BUCKETS, SCRIPTS
from ampd.serve.state.store import (STARTED, BatchReport, HistoryEntry, QueueEntry, ResultHandler, RoundStart, SessionState,
                              StoreUnavailable, WorkerInfo, WorkerState)

log = logging.getLogger(__name__)

ENTRY_CACHE_SIZE = 100_000  # decoded queue entries kept between snapshots

class RedisStore:
    """``StateStore`` in a Redis server shared by every coordinator replica.

    Args:
        url: ``redis://host:port/db``.
        window_s: length of the TTFT/ITL windows, model seconds.
        prefix: namespace of every key (several clusters may share one server).
        timeout_s: socket timeout; a call that exceeds it raises ``StoreUnavailable``.

    Raises (from every method): StoreUnavailable.
    """

    def __init__(self, url: str, window_s: float = 10.0, prefix: str = "ampd:", timeout_s: float = 1.0) -> None:
        self.url, self.prefix = url, prefix
        self.bucket_s = window_s / BUCKETS
        self._redis = aioredis.Redis.from_url(url, decode_responses=True, socket_timeout=timeout_s,
                                              socket_connect_timeout=timeout_s)
        self._scripts = {name: self._redis.register_script(code) for name, code in SCRIPTS.items()}
        self._listeners: list[asyncio.Task] = []
        self._entries: dict[tuple, QueueEntry] = {}

    def _k(self, *parts: object) -> str:
        return self.prefix + ":".join(str(p) for p in parts)

    async def _run(self, coro):
        try:
            return await coro
        except (RedisError, OSError) as err:
            raise StoreUnavailable(f"Redis at {self.url} failed: {err}") from err

    async def _script(self, name: str, keys: list[str], args: list[object]):
        return await self._run(self._scripts[name](keys=keys, args=args))

    async def ping(self) -> None:
        await self._run(self._redis.ping())

    async def register_workers(self, workers: list[WorkerInfo]) -> None:
        if workers:
            mapping = {str(w.spec.worker_id): w.to_json() for w in workers}
            await self._run(self._redis.hset(self._k("workers"), mapping=mapping))
            for w in workers:
                await self._run(self._redis.hdel(self._k("w", w.spec.worker_id), "dead"))

    async def workers(self) -> list[WorkerInfo]:
        entries = await self._run(self._redis.hgetall(self._k("workers")))
        return sorted((WorkerInfo.from_json(v) for v in entries.values()), key=lambda w: w.spec.worker_id)

    async def snapshot(self, worker_ids: list[int], now_s: float) -> list[WorkerState]:
        oldest = math.floor(now_s / self.bucket_s) - BUCKETS
        rows = json.loads(await self._script("snapshot", [], [self.prefix, oldest, *worker_ids]))
        return [self._state(wid, row) for wid, row in zip(worker_ids, rows)]

    def _state(self, worker_id: int, row: list) -> WorkerState:
        entries, dead, kv, ttft_sum, ttft_count, itl_sum, itl_count, postponed, inflight, batches = row
        postponed = _pairs(postponed) if postponed else {}
        batches = {replica: BatchReport.from_list(report) for replica, report in _pairs(batches).items()}
        queue = [self._entry(e, int(postponed.get(f"{e[0]}#{e[1]}", 0))) for e in entries]
        return WorkerState(worker_id, not dead, queue, [self._entry(e) for e in inflight],
                           ttft_sum / ttft_count if ttft_count else None, itl_sum / itl_count if itl_count else None,
                           kv, batches)

    def _entry(self, values: list, postponements: int = 0) -> QueueEntry:
        """A decoded entry, reused from earlier snapshots: a waiting task's entry
        does not change, and building it again dominated the routing time."""
        key = (values[0], values[1], values[6], values[9], postponements)
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= ENTRY_CACHE_SIZE:
                self._entries.clear()
            entry = self._entries[key] = QueueEntry.from_list(values, postponements)
        return entry

    async def set_alive(self, worker_id: int, alive: bool) -> None:
        key = self._k("w", worker_id)
        await self._write(worker_id, lambda pipe: pipe.hdel(key, "dead") if alive else pipe.hset(key, "dead", 1))

    async def sessions(self) -> dict[str, SessionState]:
        """Reads the whole ``sessions`` hash: O(sessions)."""
        entries = await self._run(self._redis.hgetall(self._k("sessions")))
        return {sid: SessionState.from_json(text) for sid, text in entries.items()}

    async def bind_session(self, session_id: str, state: SessionState, capacity_tokens: int, lease: str,
                           lease_ttl_s: float) -> str:
        return await self._script("bind", [], [self.prefix, session_id, state.to_json(), capacity_tokens, lease,
                                               _ms(lease_ttl_s), _replica(lease)])

    async def start_round(self, session_id: str, scope: str, lease: str, lease_ttl_s: float, need_tokens: int,
                          now_s: float) -> RoundStart:
        reply = await self._script("start", [], [self.prefix, session_id, scope, lease, _ms(lease_ttl_s),
                                                 need_tokens, repr(now_s), _replica(lease)])
        if reply[0] != STARTED:
            return RoundStart(reply[0])
        return RoundStart(STARTED, SessionState.from_json(reply[1]), SessionState.from_json(reply[2]))

    async def move_session(self, session_id: str, lease: str, state: SessionState, capacity_tokens: int,
                           lease_ttl_s: float) -> str:
        return await self._script("put", [], [self.prefix, session_id, lease, state.to_json(), capacity_tokens,
                                              _ms(lease_ttl_s), state.num_rounds])

    async def close_round(self, session_id: str, lease: str, state: SessionState | None, num_rounds: int) -> str:
        return await self._script("put", [], [self.prefix, session_id, lease, state.to_json() if state else "", "",
                                              "0", num_rounds])

    async def renew_leases(self, leases: dict[str, str], lease_ttl_s: float) -> list[str]:
        if not leases:
            return []
        pairs = [part for item in leases.items() for part in item]
        return await self._script("renew", [], [self.prefix, _ms(lease_ttl_s), *pairs])

    async def expire_sessions(self, idle_before_s: float) -> list[str]:
        """One script over the whole ``sessions`` hash: O(sessions) per call."""
        return await self._script("expire", [], [self.prefix, repr(idle_before_s)])

    async def audit_kv(self, worker_ids: list[int]) -> dict[int, tuple[int, int]]:
        """One script over the whole ``sessions`` hash: O(sessions) per call."""
        totals = {}
        for row in await self._script("audit", [], [self.prefix, *worker_ids]):
            worker_id, stored, derived = (int(v) for v in row.split(","))
            totals[worker_id] = (stored, derived)
        return totals

    async def restore_sessions(self, states: dict[str, SessionState]) -> list[str]:
        if not states:
            return []
        pairs = [part for sid, state in states.items() for part in (sid, state.to_json())]
        return await self._script("restore", [], [self.prefix, *pairs])

    async def index_history(self, session_id: str, key: str, entry: HistoryEntry, max_entries_per_key: int,
                            max_entries_per_session: int, kept_to_round: int) -> bool:
        return bool(await self._script("index", [], [self.prefix, session_id, key, json.dumps(entry.to_list()),
                                                     max_entries_per_key, max_entries_per_session,
                                                     kept_to_round]))

    async def history_entries(self, keys: list[str]) -> list[list[HistoryEntry]]:
        if not keys:
            return []
        texts = await self._run(self._redis.hmget(self._k("hidx"), keys))
        return [[HistoryEntry.from_list(e) for e in json.loads(text)] if text else [] for text in texts]

    async def epoch(self) -> str:
        return await self._script("epoch", [self._k("epoch")], [uuid.uuid4().hex])

    async def subscribe_owners(self, handler: Callable[[str, str], None]) -> None:
        """Call ``handler(session id, replica id)`` whenever a replica starts a round
        of a session (so the others forget what they knew of it)."""
        def on_message(data: str) -> None:
            session_id, replica = json.loads(data)
            handler(session_id, replica)
        await self._listen_to(self._k("owners"), on_message)

    async def push(self, worker_id: int, entry: QueueEntry, payload: str) -> None:
        keys = [self._k("q", worker_id), self._k("qp", worker_id)]
        await self._script("push", keys, [entry.key, entry.to_json(), payload, *self._feed(worker_id)])

    async def set_postponements(self, worker_id: int, counts: dict[str, int]) -> None:
        if counts:
            mapping = {f"postp:{key}": n for key, n in counts.items()}
            await self._write(worker_id, lambda pipe: pipe.hset(self._k("w", worker_id), mapping=mapping))

    def _queue_keys(self, worker_id: int) -> list[str]:
        return [self._k(kind, worker_id) for kind in ("q", "qp", "w")]

    async def take(self, worker_id: int, entry: QueueEntry, dispatch_s: float) -> tuple[QueueEntry, str] | None:
        waiting = QueueEntry(QueuedTask(entry.queued.task, entry.queued.enqueue_s, entry.queued.cost_s),
                             entry.owner)
        running = QueueEntry(entry.queued, entry.owner, dispatch_s)
        payload = await self._script("take", self._queue_keys(worker_id),
                                     [entry.key, waiting.to_json(), running.to_json(), *self._feed(worker_id)])
        return None if payload is None else (running, payload)

    async def withdraw(self, worker_id: int, entry: QueueEntry) -> bool:
        args = [entry.key, entry.to_json(), "", *self._feed(worker_id)]
        return await self._script("take", self._queue_keys(worker_id), args) is not None

    async def add_inflight(self, worker_id: int, entry: QueueEntry) -> None:
        await self._write(worker_id, lambda pipe: pipe.hset(self._k("w", worker_id), f"infl:{entry.key}",
                                                            entry.to_json()))

    async def remove_inflight(self, worker_id: int, key: str) -> None:
        await self._write(worker_id, lambda pipe: pipe.hdel(self._k("w", worker_id), f"infl:{key}"))

    async def add_samples(self, worker_id: int, kind: str, now_s: float, total_s: float, count: int) -> None:
        bucket = math.floor(now_s / self.bucket_s)
        await self._script("samples", [self._k("w", worker_id)],
                           [f"win:{kind}:{bucket % (BUCKETS + 1)}", bucket, total_s, count, *self._feed(worker_id)])

    async def report_batch(self, worker_id: int, replica_id: str, report: BatchReport) -> None:
        # Not announced on the change feed: a replica streaming from the worker flushes its ITL
        # samples in the same period, which is announced, and the mirrors re-read everything every
        # ``StateMirror.refresh_s`` anyway; announcing it too doubled the feed's re-reads.
        await self._run(self._redis.hset(self._k("w", worker_id), f"batch:{replica_id}",
                                         json.dumps(report.to_list())))

    async def drop_batch_reports(self, worker_id: int, before_s: float) -> int:
        return await self._script("drop_batches", [self._k("w", worker_id)], [repr(before_s)])

    async def acquire_lease(self, worker_id: int, owner: str, ttl_s: float) -> bool:
        return bool(await self._run(self._redis.set(self._k("lease", worker_id), owner, nx=True, px=_ms(ttl_s))))

    async def release_lease(self, worker_id: int, owner: str) -> None:
        await self._script("release", [self._k("lease", worker_id)], [owner])

    async def publish(self, owner: str, message: dict) -> None:
        await self._run(self._redis.publish(self._k("results", owner), json.dumps(message)))

    async def subscribe(self, owner: str, handler: ResultHandler) -> None:
        await self._listen_to(self._k("results", owner), lambda data: handler(json.loads(data)))

    def _feed(self, worker_id: int) -> tuple[str, str]:
        """The change feed's channel and a worker id: the ARGV a script announces with."""
        return self._k("changes"), str(worker_id)

    async def _write(self, worker_id: int, command: Callable) -> None:
        """One write to a worker's state and its announcement, in one round trip."""
        async with self._redis.pipeline(transaction=True) as pipe:
            command(pipe)
            pipe.publish(*self._feed(worker_id))
            await self._run(pipe.execute())

    async def subscribe_changes(self, handler: Callable[[list[int] | None], None]) -> None:
        """Call ``handler`` with the ids of workers whose state changed (any
        replica's doing), or with None when changes may have been missed (the
        channel broke): the feed a ``StateMirror`` keeps itself current with."""
        def on_message(data: str) -> None:
            handler([int(w) for w in data.split(",") if w])
        await self._listen_to(self._k("changes"), on_message, lambda: handler(None))

    async def _listen_to(self, channel: str, on_message: Callable[[str], object],
                         on_gap: Callable[[], object] = lambda: None) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        await self._run(pubsub.subscribe(channel))
        self._listeners.append(asyncio.create_task(self._listen(pubsub, channel, on_message, on_gap)))

    async def _listen(self, pubsub, channel: str, on_message: Callable[[str], object],
                      on_gap: Callable[[], object]) -> None:
        """Deliver messages; through an outage, keep resubscribing (a result missed
        meanwhile makes its waiter time out and recompute locally; a missed change
        makes ``on_gap`` tell the mirror to refresh everything)."""
        while True:
            try:
                message = await pubsub.get_message(timeout=1.0)
                if message is not None:
                    result = on_message(message["data"])
                    if inspect.isawaitable(result):
                        await result
            except (RedisError, OSError) as err:
                log.warning("channel %s: %s; resubscribing", channel, err)
                on_gap()
                await asyncio.sleep(0.5)
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.subscribe(channel)

    async def close(self) -> None:
        for task in self._listeners:
            task.cancel()
        await asyncio.gather(*self._listeners, return_exceptions=True)
        self._listeners.clear()
        await self._redis.aclose()


def _ms(seconds: float) -> int:
    """Wall milliseconds for a Redis expiry (at least 1)."""
    return max(1, int(seconds * 1000))


def _replica(lease: str) -> str:
    """The replica a round lease names (``<replica>#<n>``)."""
    return lease.rpartition("#")[0]


def _pairs(flat: list[str]) -> dict[str, str]:
    """A Redis HGETALL reply from a script (flat key, value list) as a dict."""
    return dict(zip(flat[::2], flat[1::2]))
