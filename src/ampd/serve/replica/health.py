"""Engine liveness as one replica sees it: engines marked dead by a failed call
or by failed health checks, revived when their health check answers again;
every change is written to the store so the other replicas' views leave the
engine out too."""

from __future__ import annotations

import asyncio
import logging

from ampd.serve.replica.context import ReplicaContext
from ampd.engines.client import EngineClient

log = logging.getLogger(__name__)

# [our choice] A health check that fails this many times in a row marks an engine dead: one
# slow answer from a starved but live engine does not (a refused connection mid-round still
# marks it at once).
HEALTH_FAILURES_TO_DEAD = 3


class EngineHealth:
    """The engines this replica considers dead.

    Args:
        ctx: the replica's shared parts.
        engines: the HTTP client the health checks use.
    """

    def __init__(self, ctx: ReplicaContext, engines: EngineClient) -> None:
        self.ctx, self.engines = ctx, engines
        self.dead: set[int] = set()
        self._failures: dict[int, int] = {}

    async def mark_dead(self, worker_id: int) -> None:
        """Stop using an engine until its health check answers again."""
        if worker_id not in self.dead:
            log.warning("worker %d (%s) marked dead", worker_id, self.ctx.workers[worker_id].url)
            self.ctx.decide("dead", {"worker_id": worker_id})
        self.dead.add(worker_id)
        self.ctx.metrics.worker_up.labels(str(worker_id)).set(0)
        await self.ctx.store_call(self.ctx.store.set_alive(worker_id, False))

    async def reassert(self) -> None:
        """Write this replica's view of liveness again (a store that lost it)."""
        await self.ctx.store.register_workers(list(self.ctx.workers.values()))
        for worker_id in self.dead:
            await self.ctx.store.set_alive(worker_id, False)

    async def loop(self) -> None:
        """Check every engine each ``health_interval_s`` (wall seconds), forever."""
        while True:
            for worker_id, info in self.ctx.workers.items():
                up = await self.engines.health(info.url)
                failures = self._failures[worker_id] = 0 if up else self._failures.get(worker_id, 0) + 1
                self.ctx.metrics.worker_up.labels(str(worker_id)).set(int(up))
                if up and worker_id in self.dead:
                    self.dead.discard(worker_id)
                    await self.ctx.store_call(self.ctx.store.set_alive(worker_id, True))
                elif failures >= HEALTH_FAILURES_TO_DEAD and worker_id not in self.dead:
                    await self.mark_dead(worker_id)
            await asyncio.sleep(self.ctx.options.health_interval_s)
