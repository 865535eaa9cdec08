"""Routing time with the shared state in Redis: wall time for a coordinator
replica to read what a router reads (every prefill worker and the session's
decode worker: ``Coordinator.routing_ids``; one Lua script round trip), build the
``ClusterView`` and run Algorithm 1, on a 16-worker cluster whose prefill queues
hold 8 tasks each. The paper's figure is 0.39 ms per routing decision (AMPD.md 3.1),
state read included. Three ways to read: a direct Redis snapshot, the replica's
mirror of Redis (``StateMirror``, what the coordinator reads when it has one; its
lag behind another replica's change is measured too), and the in-memory store.

Run: ``python bench/bench_serve_routing.py`` -> ``bench/results/serve_routing.json``.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from ampd.core import Deployment, PrefillTask, QueuedTask, Role  # noqa: E402
from ampd.perf import build_perf_model  # noqa: E402
from ampd.policy.routing import AdaptiveRouter, PredictiveRouter, SloThresholds  # noqa: E402
from ampd.core.clock import ScaledClock  # noqa: E402
from ampd.serve.state.memory_store import MemoryStore  # noqa: E402
from ampd.serve.state.mirror import StateMirror  # noqa: E402
from ampd.cluster.redis_server import RedisProcess  # noqa: E402
from ampd.serve.state.redis_store import RedisStore  # noqa: E402
from ampd.serve.state.store import QueueEntry, WorkerInfo  # noqa: E402
from ampd.cluster.up import free_port_block  # noqa: E402
from ampd.serve.rounds.view_builder import cluster_view  # noqa: E402

DEPLOYMENT = "P:<TP=2,DP=8> D:<TP=4,DP=8>"  # 16 workers, 48 GPUs
QUEUE_LENGTH = 8
REPEATS = 2000


async def _fill(store, workers: list[WorkerInfo], rng: random.Random) -> None:
    await store.register_workers(workers)
    for w in workers:
        if w.spec.role is Role.PREFILL:
            for i in range(QUEUE_LENGTH):
                task = PrefillTask(f"q{w.spec.worker_id}-{i}", 1, 4000, 600, 100.0, 8)
                await store.push(w.spec.worker_id, QueueEntry(QueuedTask(task, 100.0, rng.uniform(0.1, 1.0)), "r"),
                                 "{}")
        else:
            await store.add_samples(w.spec.worker_id, "itl", 100.0, 0.5, 10)


async def _measure(read, workers: list[WorkerInfo], router, perf) -> list[float]:
    """Wall seconds of ``read`` (the workers' states) + view + Algorithm 1, per decision."""
    infos = {w.spec.worker_id: w for w in workers}
    task = PrefillTask("s", 2, 8000, 700, 100.0, 8)
    ids = sorted([w.spec.worker_id for w in workers if w.spec.role is Role.PREFILL] + [task.decode_worker])
    samples = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        states = await read(ids)
        router.route(task, cluster_view(infos, states, perf, 101.0, batch_max_age_s=1.0), 101.0)
        samples.append(time.perf_counter() - start)
    return samples


async def _mirror_lag(url: str, mirror: StateMirror, prefix: str) -> list[float]:
    """Wall seconds from another replica's push returning to this replica's mirror showing it."""
    other = RedisStore(url, prefix=prefix)
    lags = []
    for i in range(200):
        before = len(mirror.states([0])[0].queue)
        task = PrefillTask(f"lag-{i}", 0, 0, 100, 100.0, 8)
        await other.push(0, QueueEntry(QueuedTask(task, 100.0, 0.1), "other"), "{}")
        start = time.perf_counter()
        while len(mirror.states([0])[0].queue) == before:
            await asyncio.sleep(0)
        lags.append(time.perf_counter() - start)
    await other.close()
    return lags


def _figures(prefix: str, samples: list[float]) -> dict:
    ordered = sorted(samples)
    return {f"{prefix}_median_ms": 1e3 * statistics.median(ordered),
            f"{prefix}_p99_ms": 1e3 * ordered[int(0.99 * len(ordered))]}


async def run() -> dict:
    rng = random.Random(0)
    perf = build_perf_model("Llama-3.1-70B", "H20")
    slo = SloThresholds(3.0, 0.06)
    specs = Deployment.parse(DEPLOYMENT).workers(48)
    workers = [WorkerInfo(s, f"http://127.0.0.1:{9000 + s.worker_id}", "mock") for s in specs]
    figures = {}
    with RedisProcess(free_port_block(1)) as server:
        redis_store = RedisStore(server.url)
        await _fill(redis_store, workers, rng)
        await _fill(memory := MemoryStore(), workers, rng)
        mirror = StateMirror(redis_store, [w.spec.worker_id for w in workers], ScaledClock())
        await mirror.start()
        reads = {"memory": lambda ids: memory.snapshot(ids, 101.0),
                 "redis": lambda ids: redis_store.snapshot(ids, 101.0),
                 "redis_mirror": lambda ids: _ready(mirror.states(ids))}
        for read_name, read in reads.items():
            for name, router in (("adaptive", AdaptiveRouter(perf, slo, random.Random(1))),
                                 ("predictive", PredictiveRouter(perf, slo, random.Random(1)))):
                await _measure(read, workers, router, perf)  # warm up
                figures.update(_figures(f"{read_name}_{name}", await _measure(read, workers, router, perf)))
        figures.update(_figures("mirror_lag", await _mirror_lag(server.url, mirror, redis_store.prefix)))
        figures.update(_figures("redis_ping", await _pings(redis_store)))
        await mirror.stop()
        await redis_store.close()
    return figures


async def _pings(store: RedisStore) -> list[float]:
    """Wall seconds of a bare PING through the same asyncio client: the floor of any Redis read."""
    samples = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        await store.ping()
        samples.append(time.perf_counter() - start)
    return samples


async def _ready(value):
    return value


def main() -> None:
    figures = asyncio.run(run())
    for k, v in figures.items():
        print(f"{k}: {v:.3f} ms")
    write_result("serve_routing", {"deployment": DEPLOYMENT, "num_workers": 16, "queue_length": QUEUE_LENGTH,
                                   "repeats": REPEATS, "paper_route_ms": 0.39, **figures})


if __name__ == "__main__":
    main()
