"""Dispatch of the coordinator-held prefill queues (AMPD.md section 3.2): when a
prefill engine has a free slot, reorder its queue's head (Algorithm 2), send the
head task, and publish the engine's reply to the replica that owns the request.

Replicas share the queues in the store; a lease (one holder per worker queue)
makes sure a task is sent once. After giving the lease back a dispatcher looks
at the queue again, so a task pushed by a replica that found the lease taken is
never stranded; a periodic sweep covers a replica that died holding one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping

from ampd.policy.reorder import QueuePolicy, apply_order
from ampd.serve.rounds.chat import PROMPT_CHECK_KEY, prompt_mismatch
from ampd.core.clock import ScaledClock
from ampd.engines.client import EngineClient, EngineError
from ampd.engines.history_export import EXPORT_KEY, EXPORT_SHARE_OF_DEADLINE, ExportRequest, cached_tokens, export_history
from ampd.serve.state.store import QueueEntry, StateStore, StoreUnavailable, WorkerInfo, WorkerState, task_key
from ampd.serve.rounds.view_builder import busy_s

log = logging.getLogger(__name__)

LEASE_TTL_S = 5.0  # wall seconds; a dispatch pass takes milliseconds


class PrefillDispatcher:
    """Sends queued prefill tasks to prefill engines.

    Args:
        store: the shared state.
        engines: HTTP client.
        queue_policy: Algorithm 2 (or FCFS).
        clock: the replicas' model clock.
        replica_id: this replica (lease owner).
        workers: prefill workers by id.
        slots: tasks a worker's engine takes at once (docs/SERVING.md).
        timeout_s: longest engine call, model seconds.
        on_engine_down: called with a worker id whose engine is unreachable.
        after_s: what follows a task leaving the queue besides its stages, before
            its first token, model seconds: the round's serving path
            (``perf.round_paths_s``, counted after the queue as the routers count
            it; the largest over the prefill workers' TPs), the same for every
            task, so the queue policy counts it as a delay.
    """

    def __init__(self, store: StateStore, engines: EngineClient, queue_policy: QueuePolicy, clock: ScaledClock,
                 replica_id: str, workers: Mapping[int, WorkerInfo], slots: Mapping[int, int], timeout_s: float,
                 on_engine_down: Callable[[int], Awaitable[None]], after_s: float = 0.0) -> None:
        self.store, self.engines, self.queue_policy, self.clock = store, engines, queue_policy, clock
        self.after_s = after_s
        self.replica_id, self.workers, self.slots, self.timeout_s = replica_id, workers, slots, timeout_s
        self.on_engine_down = on_engine_down
        self._active: set[int] = set()
        self._again: set[int] = set()
        self._calls: set[asyncio.Task] = set()

    async def kick(self, worker_id: int) -> None:
        """Dispatch what ``worker_id``'s free slots allow, unless this replica is
        already at it (it will look again) or another replica holds the lease."""
        if worker_id in self._active:
            self._again.add(worker_id)
            return
        self._active.add(worker_id)
        try:
            while await self._pass(worker_id):
                pass
        except StoreUnavailable as err:
            log.warning("dispatch to worker %d paused: %s", worker_id, err)
        finally:
            self._active.discard(worker_id)

    async def _pass(self, worker_id: int) -> bool:
        """One leased dispatch pass; True when the queue needs another look."""
        self._again.discard(worker_id)
        if not await self.store.acquire_lease(worker_id, self.replica_id, LEASE_TTL_S):
            return False
        try:
            while await self._dispatch_one(worker_id):
                pass
        finally:
            await self.store.release_lease(worker_id, self.replica_id)
        if worker_id in self._again:
            return True
        [state] = await self.store.snapshot([worker_id], self.clock.now_s())
        return self._can_dispatch(worker_id, state)

    def _can_dispatch(self, worker_id: int, state: WorkerState) -> bool:
        return state.alive and bool(state.queue) and len(state.inflight) < self.slots[worker_id]

    async def _dispatch_one(self, worker_id: int) -> bool:
        """Reorder the head, send it; False when nothing can be sent now."""
        now_s = self.clock.now_s()
        [state] = await self.store.snapshot([worker_id], now_s)
        if not self._can_dispatch(worker_id, state):
            return False
        queued = [e.queued for e in state.queue]
        decision = self.queue_policy.pick(queued, now_s, busy_s(state.inflight, now_s) + self.after_s)
        reordered = apply_order(queued, decision)
        await self.store.set_postponements(worker_id, {
            task_key(q.task.session_id, q.task.round_index): q.postponements for q, old in zip(reordered, queued) if q.postponements != old.postponements})
        head = state.queue[decision.order[0]] if decision.order else state.queue[0]
        taken = await self.store.take(worker_id, head, now_s)
        if taken is not None:  # queued until taken, by this clock (another host's skew: never below 0)
            queued_s = max(0.0, self.clock.now_s() - head.queued.enqueue_s)
            call = asyncio.create_task(self._call(worker_id, *taken, queued_s))
            self._calls.add(call)
            call.add_done_callback(self._calls.discard)
        return True

    async def _call(self, worker_id: int, entry: QueueEntry, payload: str, queued_s: float) -> None:
        """Run one remote prefill and publish its outcome, with how long it was
        queued and its engine calls took (``phases_s``, model seconds;
        ``round_phases``), to the request's owner."""
        task = entry.queued.task
        phases = {"queue": queued_s, "export": 0.0, "prefill": 0.0}
        message = {"key": entry.key, "worker_id": worker_id, "phases_s": phases}
        body = json.loads(payload)
        export = body.pop(EXPORT_KEY, None)
        check = body.pop(PROMPT_CHECK_KEY, None)
        timeout_s = self.timeout_s * self.clock.time_scale
        try:
            sent_s = self.clock.now_s()
            if export is not None:  # the lazy history read: at dispatch, not at routing
                message["export"] = await export_history(self.engines, body, ExportRequest.from_dict(export),
                                                         task.session_id, timeout_s * EXPORT_SHARE_OF_DEADLINE)
                exported_s = self.clock.now_s()
                phases["export"], sent_s = exported_s - sent_s, exported_s
            reply = await self.engines.complete(self.workers[worker_id].url, body, task.session_id, timeout_s)
            phases["prefill"] = self.clock.now_s() - sent_s
            problem = check and prompt_mismatch(check, reply.get("prompt_token_ids"), "prefill", worker_id)
            if problem:
                message.update(ok=False, error=problem, reason="prompt-mismatch", status=502)
            else:
                message.update(ok=True, kv_transfer_params=reply.get("kv_transfer_params"),
                               cached_tokens=cached_tokens(reply))
        except EngineError as err:  # the message, not the engine's URL: it may reach the client
            message.update(ok=False, error=err.message, reason=err.reason, status=err.status)
            if err.engine_down:
                await self.on_engine_down(worker_id)
        except Exception as err:  # never leave the slot taken: the owner recomputes locally
            log.exception("prefill %s on worker %d failed", entry.key, worker_id)
            message.update(ok=False, error=f"{type(err).__name__}: {err}", reason="error")
        try:
            await self.store.remove_inflight(worker_id, entry.key)
            await self.store.publish(entry.owner, message)
        except StoreUnavailable as err:
            log.warning("prefill %s done but not published: %s", entry.key, err)
        await self.kick(worker_id)

    async def close(self) -> None:
        """Cancel the engine calls in flight."""
        for call in list(self._calls):
            call.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)
