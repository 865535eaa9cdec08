"""Serving under faults: 120 ToolBench-like sessions (460 rounds; Llama-3.1-70B on
8 x H20, ``P:<TP=2,DP=2> D:<TP=2,DP=2>``, 1.5 sessions/s, ``ampd-predictive``)
replayed through two coordinator replicas sharing a real Redis over four mock
engines, while a decode engine, Redis and one replica are each killed (SIGKILL)
and started again. The load generator fails a round over to the other replica
when its connection breaks or it is answered 409/5xx (``replay``'s ``retry_s``),
as a client behind a load balancer would.

Figures, for the replay with the faults and, for reference, the same replay
without them on a fresh cluster: sessions lost (a round that never completed)
and hung (silent for the client's timeout), reservation drift at the end (each
decode engine's reserved KV in Redis minus the sum over the sessions bound to
it, and what is left once every session ended), the audit's repairs (both
replicas, the killed one's counted before it died), bindings restored after
Redis came back empty, SLO attainment (and the simulator's, without faults).

Run: ``python bench/bench_chaos.py`` -> ``bench/results/chaos.json``.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from ampd.config import RunConfig  # noqa: E402
from ampd.run.resolve import sessions_for  # noqa: E402
from ampd.run.simulate import simulate  # noqa: E402
from ampd.metrics.summary import summarize  # noqa: E402
from ampd.core.clock import ScaledClock  # noqa: E402
from ampd.serve.state.redis_store import RedisStore  # noqa: E402
from ampd.cluster.replay import replay_across  # noqa: E402
from ampd.cluster.up import LocalCluster, free_serve_ports  # noqa: E402

TIME_SCALE = 0.5
REPLICAS = 2
DECODE = [2, 3]
RETRY_S = 90.0  # wall seconds a round may be retried: past a replica's restart and its leases' expiry
TIMEOUT_S = 60.0  # wall seconds of silence after which a round counts as hung
# (wall seconds after the replay starts, what, part): each part is killed, then started again.
FAULTS = [(10.0, "kill", "engine-3-decode"), (20.0, "restart", "engine-3-decode"),
          (30.0, "kill", "redis"), (35.0, "restart", "redis"),
          (45.0, "kill", "coordinator-1"), (50.0, "restart", "coordinator-1")]
COUNTERS = ("ampd_kv_audit_repairs_total", "ampd_kv_audit_repaired_tokens_total", "ampd_sessions_restored_total",
            "ampd_rebinds_total", "ampd_kv_fallbacks_total", "ampd_store_errors_total")


def _config() -> RunConfig:
    return RunConfig(system="ampd-predictive",
                     cluster={"model": "Llama-3.1-70B", "gpu": "H20", "num_gpus": 8,
                              "deployment": "P:<TP=2,DP=2> D:<TP=2,DP=2>"},
                     workload={"name": "toolbench", "num_sessions": 120, "rate_per_s": 1.5},
                     serve={**free_serve_ports(), "time_scale": TIME_SCALE, "kv_audit_interval_s": 2.0})


def _counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return {name: sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                      if line.startswith(name) and line[len(name)] in " {") for name in COUNTERS}


async def _faults(cluster: LocalCluster, planned: list, log: list[dict], counted: list[dict[str, float]]) -> None:
    start = time.monotonic()
    for at_s, action, part in planned:
        await asyncio.sleep(max(0.0, at_s - (time.monotonic() - start)))
        if action == "kill":
            if part.startswith("coordinator"):  # its counters die with it: read them first
                counted.append(await asyncio.to_thread(_counters, cluster.urls[int(part.rsplit("-", 1)[1])]))
            cluster.kill(part)
        else:
            await asyncio.to_thread(cluster.restart, part)
        log.append({"at_s": round(time.monotonic() - start, 2), "action": action, "part": part})
        print(f"{log[-1]['at_s']:6.1f} s  {action} {part}", flush=True)


async def _reservations(redis_url: str) -> dict:
    store = RedisStore(redis_url)
    try:
        states = await store.snapshot(DECODE, 0.0)
        sessions = await store.sessions()
    finally:
        await store.close()
    totals = {s.worker_id: s.kv_used_tokens for s in states}
    sums = dict.fromkeys(DECODE, 0)
    for state in sessions.values():
        sums[state.decode_worker] += state.reserved_tokens
    return {"reserved_tokens": totals, "sum_over_sessions_tokens": sums, "sessions_left": len(sessions),
            "bindings_left": {sid: state.to_json() for sid, state in sessions.items()},
            "drift_tokens": {w: totals[w] - sums[w] for w in DECODE}}


def _replay(config: RunConfig, sim, faults_planned: list) -> dict:
    """One replay through a fresh cluster with ``faults_planned``; its figures."""
    sessions = sessions_for(config)
    faults: list[dict] = []
    counted: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as logs, LocalCluster(config, logs, coordinators=REPLICAS) as cluster:
        async def run():
            trace = replay_across(cluster.urls, sessions, model=config.cluster.model, clock=ScaledClock(TIME_SCALE),
                                  ttft_slo_s=sim.slo.ttft_s, itl_slo_s=sim.slo.itl_s, timeout_s=TIMEOUT_S,
                                  retry_s=RETRY_S)
            results, _ = await asyncio.gather(trace, _faults(cluster, faults_planned, faults, counted))
            return results
        started = time.monotonic()
        results = asyncio.run(run())
        wall_s = time.monotonic() - started
        time.sleep(2 * config.serve.kv_audit_interval_s)  # an audit after the last session ended
        reservations = asyncio.run(_reservations(cluster.config.serve.redis_url))
        counted += [_counters(url) for url in cluster.urls]
    records = [r for result in results for r in result.sessions]
    failed = [f for result in results for f in result.failed]
    retries = [r for result in results for r in result.retries]
    served = summarize(records, sim.slo.ttft_s, sim.slo.itl_s)
    retried_ids = {r[0] for r in retries}
    untouched = summarize([r for r in records if r.session_id not in retried_ids], sim.slo.ttft_s, sim.slo.itl_s)
    totals = {name: sum(c[name] for c in counted) for name in COUNTERS}
    return {
        "sessions": len(sessions), "rounds": sum(len(s.rounds) for s in sessions),
        "sessions_lost": len(failed), "sessions_hung": sum(1 for f in failed if f[2].startswith("timeout")),
        "failures": [list(f) for f in failed],
        "rounds_retried": len(retries), "retry_reasons": sorted({r[2].split(":")[0] for r in retries}),
        **reservations,
        "reservation_drift_tokens": sum(abs(d) for d in reservations["drift_tokens"].values()),
        "audit_repairs": totals["ampd_kv_audit_repairs_total"],
        "audit_repaired_tokens": totals["ampd_kv_audit_repaired_tokens_total"],
        "sessions_restored": totals["ampd_sessions_restored_total"],
        "rebinds": totals["ampd_rebinds_total"], "kv_fallbacks": totals["ampd_kv_fallbacks_total"],
        "store_errors": totals["ampd_store_errors_total"],
        "attainment": served.slo_attainment,
        "sessions_never_retried": untouched.num_sessions, "attainment_of_sessions_never_retried": untouched.slo_attainment,
        "ttft_mean_s": served.ttft_mean_s, "itl_mean_s": served.itl_mean_s,
        "faults": faults, "wall_s": round(wall_s, 1),
    }


def main() -> None:
    config = _config()
    sim = simulate(config)
    reference = _replay(config, sim, [])
    config = _config()  # fresh ports
    figures = _replay(config, sim, FAULTS)
    for key in ("sessions_lost", "sessions_hung", "rounds_retried", "reservation_drift_tokens", "sessions_left",
                "audit_repairs", "sessions_restored", "attainment"):
        print(f"{key}: {figures[key]} (without faults: {reference[key]})")
    write_result("chaos", {"deployment": config.cluster.deployment, "replicas": REPLICAS, "time_scale": TIME_SCALE,
                           "rate_per_s": config.workload.rate_per_s, "retry_s": RETRY_S, "timeout_s": TIMEOUT_S,
                           "ttft_slo_s": sim.slo.ttft_s, "itl_slo_s": sim.slo.itl_s,
                           "simulated_attainment_without_faults": sim.summary.slo_attainment,
                           "with_faults": figures, "without_faults": reference})


if __name__ == "__main__":
    main()
