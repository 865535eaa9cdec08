"""The two state stores behave the same (the in-memory one and a real Redis
server), on values worked out by hand."""

import asyncio
import itertools

import pytest

from ampd.core.deployment import Role, WorkerSpec
from ampd.core.task import PrefillTask
from ampd.core.view import QueuedTask
from ampd.serve.memory_store import MemoryStore
from ampd.serve.redis_store import RedisStore
from ampd.serve.store import BOUND, FULL, TAKEN, QueueEntry, SessionState, StoreUnavailable, WorkerInfo

_prefixes = itertools.count()
WORKERS = [WorkerInfo(WorkerSpec(0, Role.PREFILL, 2, 0), "http://127.0.0.1:9000", "mock"),
           WorkerInfo(WorkerSpec(1, Role.DECODE, 4, 1), "http://127.0.0.1:9001", "vllm")]


def entry(sid: str, rnd: int = 0, cost_s: float = 0.5) -> QueueEntry:
    return QueueEntry(QueuedTask(PrefillTask(sid, rnd, 100, 50, 10.0, 1), 10.5, cost_s), "replica-a")


@pytest.fixture(params=["memory", "redis"])
def make_store(request):
    def make():
        if request.param == "memory":
            return MemoryStore(window_s=10.0)
        url = request.getfixturevalue("redis_server").url
        return RedisStore(url, window_s=10.0, prefix=f"t{next(_prefixes)}:")
    return make


def run(coro):
    return asyncio.run(coro)


def test_registry_round_trip_and_liveness(make_store):
    async def go():
        store = make_store()
        await store.register_workers(WORKERS)
        assert await store.workers() == WORKERS
        await store.set_alive(1, False)
        states = await store.snapshot([0, 1], 100.0)
        assert [s.alive for s in states] == [True, False]
        await store.register_workers(WORKERS[1:])  # re-registering revives
        assert (await store.snapshot([1], 100.0))[0].alive
        await store.close()
    run(go())


def test_binding_reserves_and_frees_kv(make_store):
    async def go():
        store = make_store()
        assert await store.bind_session("s", SessionState(1, 0, 300, 0, 1.0), 1000) == BOUND
        assert await store.bind_session("s", SessionState(0, 0, 999, 0, 1.0), 1000) == TAKEN  # first binder wins
        assert await store.bind_session("t", SessionState(1, 0, 701, 0, 1.0), 1000) == FULL  # 300 + 701 > 1000
        assert await store.get_session("t") is None
        state = await store.get_session("s")
        assert state == SessionState(1, 0, 300, 0, 1.0)
        grown = SessionState(1, 300, 700, 1, 2.0)
        await store.update_session("s", state, grown)
        assert (await store.snapshot([1], 3.0))[0].kv_used_tokens == 700
        moved = SessionState(0, 0, 650, 1, 2.0)  # rebinding moves the reservation
        await store.update_session("s", grown, moved)
        used = [s.kv_used_tokens for s in await store.snapshot([0, 1], 3.0)]
        assert used == [650, 0]
        await store.end_session("s")
        await store.end_session("s")  # twice is harmless
        assert [s.kv_used_tokens for s in await store.snapshot([0, 1], 3.0)] == [0, 0]
        assert await store.get_session("s") is None
        await store.close()
    run(go())


def test_queue_order_postponements_take_and_withdraw(make_store):
    async def go():
        store = make_store()
        for sid in ("a", "b", "c"):
            await store.push(0, entry(sid), f"body-{sid}")
        await store.set_postponements(0, {"a#0": 2})
        [state] = await store.snapshot([0], 11.0)
        assert [e.key for e in state.queue] == ["a#0", "b#0", "c#0"]
        assert [e.queued.postponements for e in state.queue] == [2, 0, 0]
        assert state.queue[1] == entry("b")
        taken = await store.take(0, state.queue[1], 12.0)
        assert taken == (QueueEntry(entry("b").queued, "replica-a", 12.0), "body-b")
        assert await store.take(0, state.queue[1], 12.0) is None  # a task is sent once
        assert await store.withdraw(0, state.queue[2])
        assert not await store.withdraw(0, state.queue[2])
        [state] = await store.snapshot([0], 12.0)
        assert [e.key for e in state.queue] == ["a#0"]
        assert [(e.key, e.dispatch_s) for e in state.inflight] == [("b#0", 12.0)]
        await store.remove_inflight(0, "b#0")
        assert (await store.snapshot([0], 12.0))[0].inflight == []
        await store.close()
    run(go())


def test_windows_average_the_last_window(make_store):
    async def go():
        store = make_store()
        await store.add_samples(0, "ttft", 100.0, 2.0, 1)
        await store.add_samples(0, "ttft", 105.0, 4.0, 1)
        await store.add_samples(1, "itl", 105.0, 0.3, 3)  # three samples summing to 0.3 s
        s0, s1 = await store.snapshot([0, 1], 106.0)
        assert s0.ttft_mean_s == pytest.approx(3.0) and s0.itl_mean_s is None
        assert s1.itl_mean_s == pytest.approx(0.1)
        # 12 s later the first sample (t=100) is out of the 10 s window, the second (t=105) too at 116
        assert (await store.snapshot([0], 112.0))[0].ttft_mean_s == pytest.approx(4.0)
        assert (await store.snapshot([0], 116.0))[0].ttft_mean_s is None
        await store.close()
    run(go())


def test_lease_is_exclusive_until_released(make_store, request):
    async def go():
        store = make_store()
        assert await store.acquire_lease(0, "a", 5.0)
        if isinstance(store, RedisStore):  # one process = one replica for the memory store
            assert not await store.acquire_lease(0, "b", 5.0)
            await store.release_lease(0, "b")  # not the holder: no effect
            assert not await store.acquire_lease(0, "b", 5.0)
        await store.release_lease(0, "a")
        assert await store.acquire_lease(0, "b", 5.0)
        await store.close()
    run(go())


def test_publish_reaches_the_subscriber(make_store):
    async def go():
        store = make_store()
        got = asyncio.Queue()
        await store.subscribe("r1", got.put)
        await asyncio.sleep(0.05)
        await store.publish("r1", {"key": "s#0", "ok": True})
        assert await asyncio.wait_for(got.get(), 5) == {"key": "s#0", "ok": True}
        await store.close()
    run(go())


def test_unreachable_redis_is_a_clear_error():
    async def go():
        from redis_server import free_port
        store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5)
        with pytest.raises(StoreUnavailable, match="Redis at redis://127.0.0.1"):
            await store.ping()
        await store.close()
    run(go())


def test_idle_sessions_expire_and_free_their_kv(make_store):
    async def go():
        store = make_store()
        await store.bind_session("old", SessionState(1, 0, 300, 1, 5.0), 1000)
        await store.bind_session("new", SessionState(1, 0, 200, 1, 50.0), 1000)
        assert await store.expire_sessions(10.0) == ["old"]
        assert await store.get_session("old") is None and await store.get_session("new") is not None
        assert (await store.snapshot([1], 60.0))[0].kv_used_tokens == 200
        assert await store.expire_sessions(10.0) == []
        await store.close()
    run(go())


def test_a_coordinator_drops_in_flight_entries_nobody_owns():
    """A replica that died with a prefill in flight leaves its entry (and the
    engine slot it counts in); another replica's sweep drops it once it is older
    than twice the longest wait (here 2 x 30 s), and keeps a fresh one."""
    from ampd.config import EngineWorker, RunConfig, ServeConfig
    from ampd.serve.build import build_coordinator

    config = RunConfig(cluster={"model": "Llama-3.1-8B", "gpu": "H100-SXM", "num_gpus": 2,
                                "deployment": "P:<TP=1,DP=1> D:<TP=1,DP=1>"},
                       workload={"name": "toolbench", "num_sessions": 5},
                       serve=ServeConfig(kv_timeout_s=30, stream_idle_timeout_s=30, workers=[
                           EngineWorker(url="http://127.0.0.1:9", role="prefill"),
                           EngineWorker(url="http://127.0.0.1:9", role="decode")]))
    coordinator = build_coordinator(config, "survivor")

    async def go():
        now_s = coordinator.clock.now_s()
        old, fresh = entry("dead-owner"), entry("live-owner")
        old = QueueEntry(old.queued, "gone", now_s - 61.0)
        fresh = QueueEntry(fresh.queued, "alive", now_s - 59.0)
        await coordinator.store.add_inflight(0, old)
        await coordinator.store.add_inflight(0, fresh)
        await coordinator._drop_stale_inflight(await coordinator.store.snapshot([0, 1], now_s))
        [state] = await coordinator.store.snapshot([0], now_s)
        return [e.key for e in state.inflight]
    assert run(go()) == ["live-owner#0"]


def test_the_mirror_follows_changes_made_by_another_replica(redis_server):
    """Replica A mirrors the state; replica B (another client of the same Redis)
    queues, takes and samples: A's mirror shows each change (read back, not
    inferred) once its feed has delivered it, and equals a direct snapshot."""
    from ampd.serve.clock import ScaledClock
    from ampd.serve.mirror import StateMirror

    prefix = f"t{next(_prefixes)}:"

    async def settled(mirror, store, predicate):
        for _ in range(200):
            [mirrored] = mirror.states([0])
            if predicate(mirrored):
                return mirrored
            await asyncio.sleep(0.01)
        raise AssertionError(f"mirror never showed the change: {mirror.states([0])}")

    async def go():
        a, b = (RedisStore(redis_server.url, prefix=prefix) for _ in range(2))
        assert StateMirror.supported(a) and not StateMirror.supported(MemoryStore())
        mirror = StateMirror(a, [0, 1], ScaledClock(), refresh_s=60)  # only the feed keeps it current
        await mirror.start()
        assert [s.queue for s in mirror.states([0, 1])] == [[], []]
        await b.push(0, entry("x"), "{}")
        await b.push(0, entry("y"), "{}")
        mirrored = await settled(mirror, a, lambda s: len(s.queue) == 2)
        assert [e.key for e in mirrored.queue] == ["x#0", "y#0"]
        await b.take(0, mirrored.queue[0], 12.0)
        await b.add_samples(0, "ttft", ScaledClock().now_s(), 3.0, 2)
        mirrored = await settled(mirror, a, lambda s: s.ttft_mean_s is not None)
        [direct] = await a.snapshot([0], ScaledClock().now_s())
        assert [e.key for e in mirrored.queue] == ["y#0"] and [e.key for e in mirrored.inflight] == ["x#0"]
        assert mirrored.ttft_mean_s == pytest.approx(1.5) == direct.ttft_mean_s
        # the pipelined writes announce themselves too: liveness, bindings, in-flight entries
        async def settled_1(predicate):
            for _ in range(200):
                if predicate(mirror.states([1])[0]):
                    return
                await asyncio.sleep(0.01)
            raise AssertionError(f"mirror never showed the change: {mirror.states([1])}")
        await b.set_alive(1, False)
        await settled_1(lambda s: not s.alive)
        await b.bind_session("s", SessionState(1, 0, 250, 0, 1.0), 1000)
        await settled_1(lambda s: s.kv_used_tokens == 250)
        await b.end_session("s")
        await settled_1(lambda s: s.kv_used_tokens == 0)
        await b.add_inflight(1, entry("local"))
        await settled_1(lambda s: [e.key for e in s.inflight] == ["local#0"])
        await b.remove_inflight(1, "local#0")
        await settled_1(lambda s: s.inflight == [])
        await mirror.stop()
        await a.close()
        await b.close()
    run(go())
