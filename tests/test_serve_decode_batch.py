"""The decode batches the served routers read (``ampd.serve.rounds.decode_batch``): the
slack of a streaming round and the merge of the replicas' reports worked by
hand, and a real cluster (Redis, two coordinator replicas, mock engines) whose
store shows every round streaming from a decode engine while it streams, and
keeps each session's slack after its round as its gaps make it."""

import asyncio
import json
import random
import time

import httpx
import pytest

from ampd.config import RunConfig, override
from ampd.core.deployment import Role, WorkerSpec
from ampd.core.task import PrefillTask
from ampd.serve.build import serve_slo
from ampd.core.clock import ScaledClock
from ampd.serve.replica.context import CoordinatorOptions, ReplicaContext
from ampd.serve.replica.decision_log import DecisionLog
from ampd.serve.rounds.decode_batch import STALE_REPORT_AGE_S, DecodeBatches, batch_report, merged, round_slack_s
from ampd.serve.state.memory_store import MemoryStore
from ampd.serve.state.redis_store import RedisStore
from ampd.serve.rounds.round import LiveRound, RoundRequest, RoundTrace
from ampd.serve.state.store import BatchReport, SessionState, WorkerInfo
from ampd.cluster.up import LocalCluster, free_serve_ports
from serve_rounds import metric, prompt_of, run, send_round

THR_S = 0.05  # an ITL threshold for the hand-worked cases


def streaming(session_id: str, prompt_tokens: int, base_slack_s: float, first_s: float | None, last_s: float | None,
              num_tokens: int, worker: int = 3) -> LiveRound:
    trace = RoundTrace(session_id, decode_worker=worker, first_token_s=first_s, last_token_s=last_s,
                       num_tokens=num_tokens)
    request = RoundRequest(session_id, tuple(range(prompt_tokens)), 100)
    task = PrefillTask(session_id, 1, 0, prompt_tokens, 9.0, worker)
    return LiveRound(request, task, trace, SessionState(worker, itl_slack_s=base_slack_s))


# A: 0.2 s of slack from earlier rounds, 5 tokens from 10.0 to 10.3 s: 4 gaps earn 4 x 0.05,
# took 0.3: 0.2 + 0.2 - 0.3 = 0.1. B: new, 2 tokens 0.15 s apart: 0.05 - 0.15 = -0.1.
A = streaming("a", 100, 0.2, 10.0, 10.3, 5)
B = streaming("b", 50, 0.0, 10.1, 10.25, 2)


def test_a_rounds_slack_is_its_sessions_plus_what_its_gaps_earned():
    assert round_slack_s(A, THR_S) == pytest.approx(0.1)
    assert round_slack_s(B, THR_S) == pytest.approx(-0.1)
    assert round_slack_s(streaming("c", 10, 0.7, None, None, 0), THR_S) == 0.7  # no token yet: what it had


def test_a_replicas_report_counts_its_rounds_their_kv_and_smallest_slack():
    report = batch_report([A, B], THR_S, 10.4)
    assert (report.batch_size, report.context_tokens, report.as_of_s) == (2, 100 + 5 + 50 + 2, 10.4)
    assert report.min_itl_slack_s == pytest.approx(-0.1)
    assert batch_report([A, B], None, 10.4).min_itl_slack_s is None  # strict scope: no slack kept
    assert batch_report([], THR_S, 10.4) == BatchReport(0, 0, None, 10.4)


def test_a_view_sums_the_fresh_reports_and_takes_the_smallest_slack():
    reports = {"r1": BatchReport(2, 157, -0.1, 100.0), "r2": BatchReport(1, 30, 0.4, 99.5),
               "gone": BatchReport(4, 999, -5.0, 98.0),  # 2.2 s old: its replica stopped
               "idle": BatchReport(0, 0, None, 100.1), "strict": BatchReport(1, 12, None, 100.1)}
    assert merged(reports, 100.2, 1.0) == BatchReport(4, 199, -0.1, 100.2)
    assert merged({}, 100.2, 1.0) == BatchReport(0, 0, None, 100.2)


def test_a_replica_reports_while_it_streams_and_once_when_it_stops():
    async def go():
        store = MemoryStore()
        options = CoordinatorOptions("replica-a", "m", itl_slack_threshold_s=THR_S)
        batches = DecodeBatches(ReplicaContext({}, store, None, ScaledClock(), options, DecisionLog()), THR_S)
        batches.joined(A)
        batches.joined(B)
        await batches.report()
        (state,) = await store.snapshot([3], 0.0)
        report = state.batches["replica-a"]
        assert (report.batch_size, report.context_tokens) == (2, 157)
        assert report.min_itl_slack_s == pytest.approx(-0.1)
        batches.left(A)
        batches.left(B)
        await batches.report()
        (state,) = await store.snapshot([3], 0.0)
        assert state.batches["replica-a"].batch_size == 0
        await store.report_batch(3, "replica-a", BatchReport(9, 9, None, 0.0))  # a marker
        await batches.report()  # nothing streams and the empty report was written: no write
        (state,) = await store.snapshot([3], 0.0)
        assert state.batches["replica-a"].batch_size == 9
        assert batches.slack_after(A) == pytest.approx(0.1)
    run(go())


def test_a_replica_drops_the_reports_of_replicas_silent_for_a_minute():
    async def go():
        store, clock = MemoryStore(), ScaledClock()
        workers = {0: WorkerInfo(WorkerSpec(0, Role.PREFILL, 1, 0), "http://p"),
                   3: WorkerInfo(WorkerSpec(3, Role.DECODE, 1, 1), "http://d")}
        options = CoordinatorOptions("replica-a", "m", itl_slack_threshold_s=THR_S)
        batches = DecodeBatches(ReplicaContext(workers, store, None, clock, options, DecisionLog()), THR_S)
        now_s = clock.now_s()
        await store.report_batch(3, "gone", BatchReport(1, 10, None, now_s - STALE_REPORT_AGE_S - 1.0))
        await store.report_batch(3, "quiet", BatchReport(1, 10, None, now_s - STALE_REPORT_AGE_S + 30.0))
        batches.joined(A)
        await batches.report()
        assert await batches.drop_stale() == 1
        (state,) = await store.snapshot([3], now_s)
        assert sorted(state.batches) == ["quiet", "replica-a"]
    run(go())


CONFIG = RunConfig(system="ampd-slo",
                   cluster={"model": "Llama-3.1-70B", "gpu": "H20", "num_gpus": 4,
                            "deployment": "P:<TP=2,DP=1> D:<TP=2,DP=1>"},
                   workload={"name": "toolbench", "num_sessions": 5})
DECODE_WORKER = 1  # prefill engines come first
ROUNDS, OUTPUT_TOKENS = 4, 300


def test_the_store_shows_each_engines_batch_while_it_streams_and_each_sessions_slack_after(tmp_path):
    """Four rounds of 300 tokens (several wall seconds each) stream from the one
    decode engine, two through each replica: while all four stream, the store's
    reports add up to a batch of four holding their prompts and at most their
    outputs; once they end every replica's report is empty. Each session keeps
    the slack its round's gaps made, which summed over a replica's sessions is
    the threshold times their gaps minus the sum of the gaps its ITL histogram
    observed (``ampd_itl_seconds``, counted apart from the batches)."""
    config = override(CONFIG, serve={**free_serve_ports(), "time_scale": 0.5})
    itl_threshold_s = serve_slo(config).itl_s
    rng = random.Random(3)
    prompts = [prompt_of(rng, 400 + 100 * i) for i in range(ROUNDS)]
    with LocalCluster(config, tmp_path, coordinators=2) as cluster:
        urls, clock = cluster.urls, ScaledClock(0.5)
        store = RedisStore(cluster.config.serve.redis_url, config.policy.window_s)

        async def batch() -> tuple[BatchReport, dict[str, BatchReport]]:
            (state,) = await store.snapshot([DECODE_WORKER], clock.now_s())
            return merged(state.batches, clock.now_s(), clock.model_s(1.0)), state.batches

        async def watch(rounds: asyncio.Future) -> BatchReport | None:
            while not rounds.done():
                seen, _ = await batch()
                if seen.batch_size == ROUNDS:
                    return seen
                await asyncio.sleep(0.05)
            return None

        async def go():
            async with httpx.AsyncClient(timeout=120) as client:
                rounds = asyncio.ensure_future(asyncio.gather(
                    *(send_round(client, urls[i % 2], f"s{i}", prompts[i], OUTPUT_TOKENS) for i in range(ROUNDS))))
                seen = await watch(rounds)
                replies = await rounds
            deadline = time.monotonic() + 10
            while (await batch())[0].batch_size and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            after, reports = await batch()
            sessions = await store.sessions()
            await store.close()
            return seen, replies, after, reports, sessions

        seen, replies, after, reports, sessions = run(go())
        itl_sums_s = [metric(httpx.get(f"{url}/metrics").text, "ampd_itl_seconds_sum") for url in urls]
    assert [(r.status, len(r.tokens)) for r in replies] == [(200, OUTPUT_TOKENS)] * ROUNDS
    assert seen is not None, "the four rounds were never seen streaming together"
    prompt_tokens = sum(len(p) for p in prompts)
    assert prompt_tokens + ROUNDS <= seen.context_tokens <= prompt_tokens + ROUNDS * OUTPUT_TOKENS
    assert after.batch_size == 0 and sorted(reports) == ["coordinator-0", "coordinator-1"]
    assert all(r.batch_size == 0 for r in reports.values())
    for replica in range(2):
        slack_s = sum(sessions[f"s{i}"].itl_slack_s for i in range(replica, ROUNDS, 2))
        gaps = (ROUNDS // 2) * (OUTPUT_TOKENS - 1)
        assert slack_s == pytest.approx(itl_threshold_s * gaps - itl_sums_s[replica], rel=1e-9, abs=1e-9)


def test_a_ruled_out_route_option_is_logged_as_null(tmp_path):
    """An ITL-unsafe local prefill is an option of infinite TTFT; the decision log
    (memory and file) and so ``/ampd/decisions`` keep it as null, valid JSON."""
    log = DecisionLog(tmp_path / "decisions.jsonl")
    log.add("route", {"options": ((3, float("inf")), (0, 0.25)), "basis_s": float("nan")})
    log.close()
    expected = {"kind": "route", "options": [[3, None], [0, 0.25]], "basis_s": None}
    assert log.entries[0] == expected
    assert json.loads((tmp_path / "decisions.jsonl").read_text()) == expected
