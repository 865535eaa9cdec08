"""The two state stores behave the same (the in-memory one and a real Redis
server), on values worked out by hand."""

import asyncio
import itertools

import pytest

from ampd.core.deployment import Role, WorkerSpec
from ampd.core.task import PrefillTask
from ampd.core.view import QueuedTask
from ampd.serve.state.memory_store import MemoryStore
from ampd.serve.state.redis_store import RedisStore
from ampd.serve.state.store import (BOUND, BUSY, DONE, FORBIDDEN, FULL, LOST, MISSING, STARTED, TAKEN, BatchReport,
                              QueueEntry, SessionState, StoreUnavailable, WorkerInfo)

_prefixes = itertools.count()
WORKERS = [WorkerInfo(WorkerSpec(0, Role.PREFILL, 2, 0), "http://127.0.0.1:9000", "mock"),
           WorkerInfo(WorkerSpec(1, Role.DECODE, 4, 1), "http://127.0.0.1:9001", "vllm")]


def entry(sid: str, rnd: int = 0, cost_s: float = 0.5) -> QueueEntry:
    return QueueEntry(QueuedTask(PrefillTask(sid, rnd, 100, 50, 10.0, 1), 10.5, cost_s), "replica-a")


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


async def kv_totals(store, worker_ids=(0, 1)) -> list[int]:
    return [s.kv_used_tokens for s in await store.snapshot(list(worker_ids), 3.0)]


def test_binding_reserves_and_frees_kv(make_store):
    async def go():
        store = make_store()
        first = SessionState(1, 0, 300, 1, 1.0)
        assert await store.bind_session("s", first, 1000, "a#1", 10.0) == BOUND
        assert await store.bind_session("s", SessionState(0, 0, 999, 1, 1.0), 1000, "b#1", 10.0) == TAKEN
        assert await store.bind_session("t", SessionState(1, 0, 701, 1, 1.0), 1000, "b#2", 10.0) == FULL  # 300 + 701
        assert await store.sessions() == {"s": first}
        grown = SessionState(1, 300, 700, 1, 2.0)
        assert await store.move_session("s", "a#1", grown, 1000, 10.0) == DONE  # 700 replaces 300, not added
        assert await kv_totals(store) == [0, 700]
        assert await store.move_session("s", "a#1", SessionState(0, 0, 1001, 1, 2.0), 1000, 10.0) == FULL
        assert await store.move_session("s", "a#1", SessionState(0, 0, 650, 1, 2.0), 1000, 10.0) == DONE
        assert await kv_totals(store) == [650, 0]
        assert await store.close_round("s", "a#1", None, 1) == DONE
        assert await store.close_round("s", "a#1", None, 1) == DONE  # twice is harmless
        assert await kv_totals(store) == [0, 0] and await store.sessions() == {}
        await store.close()
    run(go())


def test_one_round_per_session_and_reservations_move_by_the_stored_value(make_store):
    """The lease makes a second round of a session BUSY wherever it comes from;
    a round's start grows the stored reservation to what it needs (never shrinks
    it), so the total moves by ``need - stored``, whatever copy a caller holds."""
    async def go():
        store = make_store()
        assert await store.bind_session("s", SessionState(1, 0, 300, 1, 1.0, "k"), 1000, "a#1", 10.0) == BOUND
        assert (await store.start_round("s", "k", "b#1", 10.0, 500, 2.0)).outcome == BUSY  # round 1 still runs
        done = SessionState(1, 280, 300, 1, 3.0, "k")
        assert await store.close_round("s", "a#1", done, 1) == DONE
        assert (await store.start_round("s", "other", "b#1", 10.0, 500, 4.0)).outcome == FORBIDDEN
        assert (await store.start_round("nobody", "k", "b#1", 10.0, 500, 4.0)).outcome == MISSING
        start = await store.start_round("s", "k", "b#1", 10.0, 500, 4.0)
        assert (start.outcome, start.before) == (STARTED, done)
        assert start.after == SessionState(1, 280, 500, 2, 4.0, "k")
        assert (await store.start_round("s", "k", "a#2", 10.0, 900, 4.5)).outcome == BUSY
        assert await kv_totals(store) == [0, 500]
        assert await store.close_round("s", "a#2", None, 2) == LOST  # not the lease holder: nothing changes
        assert await kv_totals(store) == [0, 500]
        given_back = SessionState(1, 280, 300, 2, 5.0, "k")
        assert await store.close_round("s", "b#1", given_back, 2) == DONE
        assert await kv_totals(store) == [0, 300]
        assert await store.close_round("s", "b#1", given_back, 2) == DONE  # repeated (its reply lost): no change
        assert await kv_totals(store) == [0, 300]
        start = await store.start_round("s", "k", "a#3", 10.0, 100, 6.0)  # needs less than it holds
        assert start.after.reserved_tokens == 300 and await kv_totals(store) == [0, 300]
        assert await store.close_round("s", "a#3", SessionState(1, 400, 400, 3, 7.0, "k"), 3) == DONE
        assert await store.close_round("s", "b#1", None, 2) == LOST  # round 2's end, repeated late: round 3 wrote
        assert await kv_totals(store) == [0, 400]
        await store.close()
    run(go())


def test_leases_expire_and_renew(make_store):
    async def go():
        store = make_store()
        await store.bind_session("s", SessionState(1, 0, 100, 1, 1.0), 1000, "a#1", 0.05)
        await asyncio.sleep(0.2)  # the holder stopped renewing: the session is free again
        assert (await store.start_round("s", "", "b#1", 10.0, 100, 2.0)).outcome == STARTED
        assert await store.renew_leases({"s": "b#1"}, 10.0) == []
        assert await store.renew_leases({"s": "a#1"}, 10.0) == ["s"]
        assert await store.close_round("s", "b#1", SessionState(1, 50, 100, 2, 3.0), 2) == DONE
        assert await store.renew_leases({"s": "b#1"}, 10.0) == []  # a vanished lease is taken back
        assert (await store.start_round("s", "", "c#1", 10.0, 100, 4.0)).outcome == BUSY
        await store.close()
    run(go())


def test_audit_repairs_a_total_that_differs_from_the_sum_over_sessions(make_store):
    async def go():
        store = make_store()
        await store.bind_session("a", SessionState(1, 0, 300, 1, 1.0), 1000, "x#1", 10.0)
        await store.bind_session("b", SessionState(1, 0, 200, 1, 1.0), 1000, "x#2", 10.0)
        assert await store.audit_kv([0, 1]) == {0: (0, 0), 1: (500, 500)}
        if isinstance(store, RedisStore):  # only a hand edit can make a total drift
            await store._redis.hincrby(store._k("w", 1), "kv", 77)
        else:
            store._kv_used[1] += 77
        assert await store.audit_kv([0, 1]) == {0: (0, 0), 1: (577, 500)}
        assert await kv_totals(store) == [0, 500]
        await store.close()
    run(go())


def test_restore_adds_back_lost_bindings_and_keeps_the_newest(make_store):
    async def go():
        store = make_store()
        epoch = await store.epoch()
        assert await store.epoch() == epoch
        await store.bind_session("live", SessionState(1, 0, 300, 2, 1.0), 1000, "x#1", 10.0)
        written = await store.restore_sessions({"live": SessionState(0, 0, 999, 1, 1.0),  # older: kept out
                                                "lost": SessionState(0, 100, 400, 3, 1.0)})
        assert written == ["lost"]
        assert await kv_totals(store) == [400, 300]
        await store.close_round("live", "x#1", SessionState(1, 280, 300, 2, 2.0), 2)
        assert await store.restore_sessions({"live": SessionState(0, 0, 350, 3, 1.0)}) == ["live"]  # newer, free
        assert await kv_totals(store) == [750, 0]
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


def test_stopped_replicas_batch_reports_are_dropped_by_age_and_no_other(make_store):
    async def go():
        store = make_store()
        await store.report_batch(1, "stopped", BatchReport(2, 500, 0.5, 30.0))
        await store.report_batch(1, "crashed", BatchReport(1, 90, None, 59.5))
        await store.report_batch(1, "live", BatchReport(3, 800, -0.25, 100.0))
        await store.report_batch(2, "stopped", BatchReport(1, 10, None, 10.0))
        await store.add_samples(1, "itl", 99.0, 0.5, 10)  # another field of the same hash: stays
        assert await store.drop_batch_reports(1, 60.0) == 2
        s1, s2 = await store.snapshot([1, 2], 100.0)
        assert s1.batches == {"live": BatchReport(3, 800, -0.25, 100.0)} and s1.itl_mean_s == pytest.approx(0.05)
        assert s2.batches == {"stopped": BatchReport(1, 10, None, 10.0)}  # another worker: untouched
        assert await store.drop_batch_reports(1, 60.0) == 0
        await store.close()
    run(go())


def test_each_replicas_batch_report_replaces_its_last_and_the_sessions_slack_round_trips(make_store):
    async def go():
        store = make_store()
        await store.report_batch(1, "a", BatchReport(3, 900, -0.25, 50.0))
        await store.report_batch(1, "b", BatchReport(1, 120, None, 50.5))
        await store.report_batch(1, "a", BatchReport(2, 700, 0.125, 51.0))  # replaces a's first
        s0, s1 = await store.snapshot([0, 1], 51.0)
        assert s0.batches == {} and s1.batches == {"a": BatchReport(2, 700, 0.125, 51.0),
                                                   "b": BatchReport(1, 120, None, 50.5)}
        state = SessionState(1, 0, 300, 1, 1.0, "", -0.375)
        assert await store.bind_session("s", state, 1000, "a#1", 10.0) == BOUND
        assert (await store.start_round("s", "", "b#1", 10.0, 300, 2.0)).outcome == BUSY  # round 1 holds it
        assert await store.close_round("s", "a#1", state, 1) == DONE
        started = await store.start_round("s", "", "b#1", 10.0, 300, 2.0)
        assert started.outcome == STARTED and started.after.itl_slack_s == -0.375 and started.after.num_rounds == 2
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


def test_idle_sessions_expire_and_free_their_kv_unless_a_round_runs(make_store):
    async def go():
        store = make_store()
        await store.bind_session("old", SessionState(1, 0, 300, 1, 5.0), 1000, "x#1", 10.0)
        await store.bind_session("busy", SessionState(1, 0, 100, 1, 5.0), 1000, "x#2", 10.0)
        await store.bind_session("new", SessionState(1, 0, 200, 1, 50.0), 1000, "x#3", 10.0)
        await store.close_round("old", "x#1", SessionState(1, 0, 300, 1, 5.0), 1)
        assert await store.expire_sessions(10.0) == ["old"]  # "busy" is as idle, but its round holds a lease
        assert sorted(await store.sessions()) == ["busy", "new"]
        assert (await store.snapshot([1], 60.0))[0].kv_used_tokens == 300
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
        await coordinator.sweep.drop_stale(await coordinator.store.snapshot([0, 1], now_s))
        [state] = await coordinator.store.snapshot([0], now_s)
        return [e.key for e in state.inflight]
    assert run(go()) == ["live-owner#0"]


def test_the_mirror_follows_changes_made_by_another_replica(redis_server):
    """Replica A mirrors the state; replica B (another client of the same Redis)
    queues, takes and samples: A's mirror shows each change (read back, not
    inferred) once its feed has delivered it, and equals a direct snapshot."""
    from ampd.core.clock import ScaledClock
    from ampd.serve.state.mirror import StateMirror

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
        await b.bind_session("s", SessionState(1, 0, 250, 0, 1.0), 1000, "b#1", 10.0)
        await settled_1(lambda s: s.kv_used_tokens == 250)
        await b.close_round("s", "b#1", None, 0)
        await settled_1(lambda s: s.kv_used_tokens == 0)
        await b.add_inflight(1, entry("local"))
        await settled_1(lambda s: [e.key for e in s.inflight] == ["local#0"])
        await b.remove_inflight(1, "local#0")
        await settled_1(lambda s: s.inflight == [])
        await mirror.stop()
        await a.close()
        await b.close()
    run(go())


def test_the_audit_counts_and_logs_what_it_repairs():
    """A coordinator's audit over its store: a total made wrong by hand (77 tokens
    more than its sessions hold) is repaired, counted in /metrics and logged."""
    from ampd.config import EngineWorker, RunConfig, ServeConfig
    from ampd.serve.build import build_coordinator
    from serve_rounds import metric

    config = RunConfig(cluster={"model": "Llama-3.1-8B", "gpu": "H100-SXM", "num_gpus": 2,
                                "deployment": "P:<TP=1,DP=1> D:<TP=1,DP=1>"},
                       workload={"name": "toolbench", "num_sessions": 5},
                       serve=ServeConfig(workers=[EngineWorker(url="http://127.0.0.1:9", role="prefill"),
                                                  EngineWorker(url="http://127.0.0.1:9", role="decode")]))
    coordinator = build_coordinator(config, "auditor")

    async def go():
        store = coordinator.store
        await store.bind_session("s", SessionState(1, 0, 300, 1, 1.0), 10_000, "x#1", 10.0)
        assert await coordinator.audit.once() == {}
        store._kv_used[1] += 77
        assert await coordinator.audit.once() == {1: (377, 300)}
        assert (await store.snapshot([1], 2.0))[0].kv_used_tokens == 300
        assert await coordinator.audit.once() == {}
    run(go())
    text = coordinator.metrics.exposition().decode()
    assert metric(text, "ampd_kv_audit_repairs_total") == 1 and metric(text, "ampd_kv_audit_repaired_tokens_total") == 77
    assert metric(text, "ampd_kv_reserved_tokens") == 300
    assert coordinator.decisions.of_kind("kv-repair") == [{"kind": "kv-repair", "worker_id": 1, "stored_tokens": 377,
                                                           "derived_tokens": 300, "replica": "auditor"}]
