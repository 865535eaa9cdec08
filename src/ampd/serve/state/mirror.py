"""A replica-local mirror of the workers' shared state, so a routing decision
reads memory instead of making a Redis round trip (docs/SERVING.md, "Routing
time").

Redis stays the source of truth. Every change any replica makes to a worker's
state is announced on the store's change feed (``RedisStore.subscribe_changes``);
the mirror re-reads the changed workers (one snapshot script for all of them) in
one background task, so reads never go backwards: a change announced while a
re-read is in flight is read again after it. Everything is re-read every
``refresh_s`` too (windows age without changes; a missed announcement heals). A
broken feed makes the mirror invalid until a full re-read succeeds; meanwhile
callers read the store directly. Lag: the announcement plus one re-read
(bench/bench_serve_routing.py measures it).
"""

from __future__ import annotations

import asyncio
import logging

from ampd.core.clock import ScaledClock
from ampd.serve.state.store import QueueEntry, StateStore, StoreUnavailable, WorkerState

log = logging.getLogger(__name__)


class StateMirror:
    """Mirror of ``worker_ids``' ``WorkerState`` in ``store``.

    Args:
        store: a store with a change feed (``subscribe_changes``).
        worker_ids: the workers to mirror.
        clock: model time (the windows' reference).
        refresh_s: period of the full re-read, wall seconds.
    """

    def __init__(self, store: StateStore, worker_ids: list[int], clock: ScaledClock, refresh_s: float = 0.5) -> None:
        self.store, self.worker_ids, self.clock, self.refresh_s = store, sorted(worker_ids), clock, refresh_s
        self._known = set(self.worker_ids)
        self._states: dict[int, WorkerState] = {}
        self._dirty: set[int] = set()
        self._wake = asyncio.Event()
        self._valid = False
        self._tasks: list[asyncio.Task] = []

    @staticmethod
    def supported(store: StateStore) -> bool:
        """True when the store announces changes (a store in the same process needs no mirror)."""
        return hasattr(store, "subscribe_changes")

    async def start(self) -> None:
        """Subscribe, read everything once, start the background re-reads.

        Raises:
            StoreUnavailable: the store does not answer.
        """
        await self.store.subscribe_changes(self._on_change)
        await self._read(self.worker_ids)
        self._valid = True
        self._tasks = [asyncio.create_task(self._reader()), asyncio.create_task(self._ticker())]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def states(self, worker_ids: list[int]) -> list[WorkerState] | None:
        """The mirrored states of ``worker_ids``, or None while the mirror is invalid."""
        if not self._valid:
            return None
        return [self._states[w] for w in worker_ids]

    def note_queued(self, worker_id: int, entry: QueueEntry) -> None:
        """This replica queued ``entry``: show it at once, before the feed's
        re-read, so its own next decision cannot herd onto the same worker."""
        state = self._states.get(worker_id)
        if state is not None:
            state.queue.append(entry)
        self._mark([worker_id])

    def note_reserved(self, worker_id: int, tokens: int) -> None:
        """This replica is binding a session of ``tokens`` KV to ``worker_id``:
        count it at once, before the store has it, so the binder's next choice
        (in a burst of new sessions) cannot herd onto the same worker. The
        re-read the bind's announcement causes replaces the guess with the
        store's total (a bind that fails announces nothing: the periodic
        re-read does). Not marked now: a re-read before the bind lands would
        drop the guess."""
        state = self._states.get(worker_id)
        if state is not None:
            state.kv_used_tokens += tokens

    def _on_change(self, worker_ids: list[int] | None) -> None:
        if worker_ids is None:  # the feed broke: changes may have been missed
            self._valid = False
            worker_ids = self.worker_ids
        self._mark(worker_ids)

    def _mark(self, worker_ids: list[int]) -> None:
        self._dirty.update(w for w in worker_ids if w in self._known)
        self._wake.set()

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            self._mark(self.worker_ids)

    async def _reader(self) -> None:
        """The only writer of the mirror: re-reads what is marked, in order."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._dirty:
                dirty, self._dirty = sorted(self._dirty), set()
                try:
                    await self._read(dirty)
                except StoreUnavailable as err:
                    log.warning("state mirror: %s", err)
                    self._valid = False
                    self._dirty.update(dirty)
                    await asyncio.sleep(0.5)
                    continue
                if len(dirty) == len(self.worker_ids):
                    self._valid = True

    async def _read(self, worker_ids: list[int]) -> None:
        for state in await self.store.snapshot(worker_ids, self.clock.now_s()):
            self._states[state.worker_id] = state
