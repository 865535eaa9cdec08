"""The coordinator's prefill dispatcher on hand-made queues (a frozen clock, the
in-memory store, an engine that answers when told): what its queue policy is told
of the time before a task could start, and the phases it sends back with a
prefill's outcome (``ampd.serve.rounds.phases``)."""

import asyncio

import pytest

from ampd.core.deployment import Role, WorkerSpec
from ampd.core.task import PrefillTask
from ampd.core.view import QueuedTask
from ampd.policy.reorder import Fcfs
from ampd.core.clock import ScaledClock
from ampd.serve.rounds.dispatch import PrefillDispatcher
from ampd.serve.state.memory_store import MemoryStore
from ampd.serve.state.store import QueueEntry, WorkerInfo


class FrozenClock(ScaledClock):
    def __init__(self, now_s: float) -> None:
        super().__init__(1.0)
        self.at_s = now_s

    def now_s(self) -> float:
        return self.at_s


class SpyPolicy(Fcfs):
    """First come, first served, remembering each ``start_delay_s`` it is given."""

    def __init__(self) -> None:
        self.delays_s: list[float] = []

    def pick(self, queue, now_s, start_delay_s=0.0):
        self.delays_s.append(start_delay_s)
        return super().pick(queue, now_s, start_delay_s)


class HeldEngine:
    """An engine whose prefills answer when ``release`` is called."""

    def __init__(self) -> None:
        self.released = asyncio.Event()

    async def complete(self, url, body, session_id, timeout_s):
        await self.released.wait()
        return {"kv_transfer_params": {"remote_block_ids": [1]}}


def _entry(session_id: str, enqueue_s: float, cost_s: float) -> QueueEntry:
    return QueueEntry(QueuedTask(PrefillTask(session_id, 0, 0, 100, enqueue_s, 1), enqueue_s, cost_s), "owner")


def test_the_queue_policy_is_told_the_dispatched_work_and_the_requests_after_it_and_the_phases_come_back():
    async def scenario():
        clock, store, engine, policy = FrozenClock(100.0), MemoryStore(), HeldEngine(), SpyPolicy()
        worker = WorkerInfo(WorkerSpec(0, Role.PREFILL, 1, 0), "http://prefill")
        await store.register_workers([worker])
        published = []
        await store.subscribe("owner", published.append)

        async def engine_down(worker_id):
            raise AssertionError("no engine is down")

        after_s = 0.009  # two engine requests' serving path, as the coordinator passes it
        dispatcher = PrefillDispatcher(store, engine, policy, clock, "replica", {0: worker}, {0: 2}, 60.0,
                                       engine_down, after_s)
        a = _entry("a", 100.0, 0.5)
        await store.push(0, a, "{}")
        await dispatcher.kick(0)  # dispatched at 100.0; the engine holds it
        await asyncio.sleep(0)  # the engine call starts
        clock.at_s = 100.2
        b = _entry("b", 100.1, 0.25)
        await store.push(0, b, "{}")
        await dispatcher.kick(0)  # a second slot; a has 0.3 s of its predicted 0.5 left
        await asyncio.sleep(0)
        clock.at_s = 100.6
        engine.released.set()
        for _ in range(20):
            await asyncio.sleep(0)
        await dispatcher.close()
        return policy.delays_s, {m["key"]: m for m in published}, a.key, b.key

    delays_s, messages, a_key, b_key = asyncio.run(scenario())
    # By hand: idle, only the requests after it (0.009); then a's predicted end
    # 100.0 + 0.5 - 100.2 = 0.3 s away, plus the requests.
    assert delays_s == pytest.approx([0.009, 0.309])
    # Queued from its enqueue to its dispatch (a: 0; b: 100.2 - 100.1), no history
    # export asked, and the engine answered both at 100.6.
    assert messages[a_key]["ok"] and messages[b_key]["ok"]
    assert messages[a_key]["phases_s"] == pytest.approx({"queue": 0.0, "export": 0.0, "prefill": 0.6})
    assert messages[b_key]["phases_s"] == pytest.approx({"queue": 0.1, "export": 0.0, "prefill": 0.4})
