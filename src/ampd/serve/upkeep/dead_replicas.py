"""Queues and in-flight entries that a replica which died leaves behind: every
``SWEEP_S``, each replica drops in-flight entries nobody will finish (and the
engine slots they hold) and looks at every prefill queue with work (one whose
lease holder died is dispatched by the next replica that looks)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from ampd.serve.replica.context import ReplicaContext
from ampd.serve.rounds.dispatch import PrefillDispatcher
from ampd.serve.state.store import StoreUnavailable, WorkerState

SWEEP_S = 0.5  # wall seconds: a queue whose lease holder died waits at most this long


class InflightSweep:
    """The periodic sweep of one replica.

    Args:
        ctx: the replica's shared parts.
        dispatcher: dispatches the queues.
        states: every worker's state (the mirror's, or the store's).
    """

    def __init__(self, ctx: ReplicaContext, dispatcher: PrefillDispatcher,
                 states: Callable[[], Awaitable[list[WorkerState]]]) -> None:
        self.ctx, self.dispatcher, self.states = ctx, dispatcher, states

    async def loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                states = await self.states()
                await self.drop_stale(states)
            except StoreUnavailable as err:
                self.ctx.store_failed(err)
                continue
            for state in states:
                if state.worker_id in self.dispatcher.workers and state.queue:
                    await self.dispatcher.kick(state.worker_id)

    async def drop_stale(self, states: list[WorkerState]) -> None:
        """An in-flight entry older than twice the longest wait any replica allows
        (``kv_timeout_s``, ``stream_idle_timeout_s``) has no owner waiting for it."""
        options = self.ctx.options
        now_s = self.ctx.clock.now_s()
        stale_s = 2 * max(options.kv_timeout_s, options.stream_idle_timeout_s)
        for state in states:
            for entry in state.inflight:
                since_s = entry.dispatch_s if entry.dispatch_s is not None else entry.queued.enqueue_s
                if now_s - since_s > stale_s:
                    await self.ctx.store.remove_inflight(state.worker_id, entry.key)
                    self.ctx.decide("stale", {"worker_id": state.worker_id, "task": entry.key})
