"""The decode engine's batching of a local prefill (issue 11, item 4), worked out by
hand with ``stub_perf.AlphaBetaStub``: prefill 10 ms + 1 ms per new token + 0.1 ms per
history token, decode step 20 ms + 2 ms per sequence. The simulator's decode worker,
the router's ``t_local`` and the planner's decode side read one estimate
(``ampd.policy.batching``)."""

import dataclasses
import math
import random
from types import SimpleNamespace

import numpy as np
import pytest

from ampd.config import RunConfig
from ampd.core import Deployment, Round, Session
from ampd.run.resolve import batching_for
from ampd.perf import build_perf_model
from ampd.planner.decode_tau import decode_cells, decode_replica
from ampd.planner.stream import build_stream
from ampd.perf.measured import EngineBatching
from ampd.policy.batching import Batching, local_prefill, measured_batching, mixed_step_s
from ampd.policy.reorder import Fcfs
from ampd.policy.routing import AdaptiveRouter, AlwaysLocalRouter, SloThresholds, local_estimate_s
from ampd.policy.systems import decode_batching, get_system
from ampd.sim.cluster import SimCluster, WorkerOptions
from stub_perf import AlphaBetaStub, StubPerf
from views import decode, prefill, queued, task, view

# A and B (50-token prompts, 30 tokens out) arrive at 0; C (300 tokens, 2 out) at 0.13.
SESSIONS = [Session("a", 0.0, (Round(50, 30),)), Session("b", 0.0, (Round(50, 30),)),
            Session("c", 0.13, (Round(300, 2),))]


def _run(batching: Batching) -> dict:
    cluster = SimCluster(Deployment.parse("D:<TP=1,DP=1>").workers(8), AlphaBetaStub(), AlwaysLocalRouter(), Fcfs(),
                         WorkerOptions(10.0, batching))
    return {s.session_id: s.rounds[0] for s in cluster.run(SESSIONS).sessions}


def test_chunked_local_prefill_ttft_and_the_batch_itl_by_hand():
    # Budget 102 tokens per step. A's prompt alone: T_pre(0, 50) = 0.06 -> first token 0.06.
    # B's prompt beside A (batch 1): 0.06 + T_dec(1) - T_dec(1) = 0.06 -> 0.12. A and B then
    # decode in steps of T_dec(2) = 0.024: 0.12-0.144, during which C arrives (0.13).
    # From 0.144 C runs in chunks of 102 - 2 = 100 tokens, each step
    # T_pre(done, 100) + T_dec(2) - T_dec(1) = T_pre + 0.002:
    #   T_pre(0, 100) = 0.110 -> 0.112, T_pre(100, 100) = 0.120 -> 0.122, T_pre(200, 100) = 0.130 -> 0.132;
    # C's first token at 0.144 + 0.366 = 0.510, TTFT 0.38; then C joins: T_dec(3) = 0.026.
    rounds = _run(Batching("chunked", 102))
    assert rounds["c"].first_token_s == pytest.approx(0.510)
    assert rounds["c"].first_token_s - 0.13 == pytest.approx(0.38)
    assert list(rounds["a"].itls_s)[:6] == pytest.approx([0.06, 0.024, 0.112, 0.122, 0.132, 0.026])
    assert list(rounds["b"].itls_s)[:5] == pytest.approx([0.024, 0.112, 0.122, 0.132, 0.026])
    # The same sessions when the engine pauses the batch (alternate): A alone 0-0.06, a step
    # 0.06-0.082, B alone 0.082-0.142, a step of 2 to 0.166, C alone (T_pre(0, 300) = 0.31) to
    # 0.476: TTFT 0.346, and A's gap across it 0.31 + T_dec(3) = 0.336.
    paused = _run(Batching("alternate"))
    assert paused["c"].first_token_s == pytest.approx(0.476)
    assert list(paused["a"].itls_s)[:3] == pytest.approx([0.022, 0.084, 0.336])


def test_local_prefill_estimate_by_hand():
    perf, chunked = AlphaBetaStub(), Batching("chunked", 102)
    run = local_prefill(perf, 1, chunked, 0, 300, 2, 0)
    assert run.ttft_s == pytest.approx(0.366)
    # each mixed step beyond a plain step of 2 (0.024): 0.088, 0.098, 0.108
    assert run.added_s == pytest.approx((0.088, 0.098, 0.108))
    assert run.delay_s == pytest.approx(0.294)
    assert mixed_step_s(perf, 1, 100, 100, 2, 0) == pytest.approx(0.122)
    # no batch: the chunks alone, 102 tokens then 102 then 96 (0.112 + 0.1222 + 0.1264)
    assert local_prefill(perf, 1, chunked, 0, 300, 0, 0).ttft_s == pytest.approx(0.3606)
    # a batch that takes the whole budget leaves the prefill no room
    starved = local_prefill(perf, 1, Batching("chunked", 2), 0, 300, 2, 0)
    assert math.isinf(starved.ttft_s) and starved.added_s == ()
    # a pause: T_pre alone, one gap lengthened by it
    paused = local_prefill(perf, 1, Batching(), 0, 300, 2, 0)
    assert (paused.ttft_s, paused.added_s) == (pytest.approx(0.31), (pytest.approx(0.31),))


def test_router_estimate_equals_the_simulated_chunked_prefill():
    # The decode worker as the simulator holds it when C's chunks start (0.144): 2 sequences,
    # nothing queued. t_local = the 0.366 s from there to C's first token in the run above.
    worker = dataclasses.replace(decode(itl=1.0), batch_size=2, context_tokens=160)
    c = task("c", hist=0, new=300)
    realised_s = _run(Batching("chunked", 102))["c"].first_token_s - 0.144
    assert local_estimate_s(c, worker, AlphaBetaStub(), Batching("chunked", 102)) == pytest.approx(realised_s)
    # a queued 100-token task runs first, in one mixed step of 0.112 (its cost_s, a pause's T_pre, is not read)
    busy = dataclasses.replace(worker, queue=(queued(9.9),))
    ahead = local_prefill(AlphaBetaStub(), 4, Batching("chunked", 102), 1000, 500, 2, 160).ttft_s
    assert local_estimate_s(c, busy, AlphaBetaStub(), Batching("chunked", 102)) == pytest.approx(0.366 + ahead)
    # a pause keeps the paper's formula: T_pre + the queued costs
    assert local_estimate_s(c, busy, AlphaBetaStub()) == pytest.approx(0.31 + 9.9)


def test_router_sends_a_starved_chunked_prefill_remote():
    # Step 3 of Algorithm 1 with a decode worker whose batch fills the budget: t_local is
    # infinite, so the remote option wins however long its queue.
    slo = SloThresholds(0.1, 0.01)
    full = dataclasses.replace(decode(itl=1.0), batch_size=64)
    router = AdaptiveRouter(StubPerf(), slo, random.Random(0), batching=Batching("chunked", 64))
    d = router.route(task(), view(full, prefill(1, ttft=5.0, busy_s=30.0)), 0.0)
    assert (d.worker_id, d.local, d.rule) == (1, False, "estimate")
    paused = AdaptiveRouter(StubPerf(), slo, random.Random(0)).route(task(), view(full, prefill(1, ttft=5.0,
                                                                                           busy_s=30.0)), 0.0)
    assert paused.local  # a pause: 0.5 s locally against 30 s of queue


def test_decode_batching_resolution():
    perf = build_perf_model("Llama-3.1-8B", "H100-SXM")
    ampd, vllm = get_system("ampd"), get_system("vllm")
    assert decode_batching(ampd, "auto", 2048, perf) == Batching("alternate", 2048)
    assert decode_batching(ampd, "chunked", 512, perf) == Batching("chunked", 512)
    assert decode_batching(vllm, "chunked", 512, perf) == Batching("prefill-first", 512)  # its name fixes it
    measured = SimpleNamespace(batching=EngineBatching("chunked", 8192))
    assert measured_batching(measured) == Batching("chunked", 8192)
    # A measured pause has no budget: Batching's default stands in, unused.
    assert measured_batching(SimpleNamespace(batching=EngineBatching("alternate"))) == Batching("alternate", 2048)
    assert measured_batching(perf) is None
    assert decode_batching(ampd, "auto", 2048, measured) == Batching("chunked", 8192)
    assert decode_batching(ampd, "alternate", 2048, measured) == Batching("alternate", 2048)
    with pytest.raises(ValueError, match="unknown decode batching"):
        decode_batching(ampd, "sometimes", 2048, perf)
    config = RunConfig.model_validate({"cluster": {"decode_batching": "chunked"}, "policy": {"chunk_tokens": 256}})
    assert batching_for(config, perf) == Batching("chunked", 256)


def test_planner_decode_tau_chunked_against_alternate_by_hand():
    # 21 sessions in 1 s, 100-token prompts, half of them local (tests/test_planner_tau.py with
    # StubPerf: prefill 1 ms/token, decode step 20 ms whatever the batch). A pause adds 0.1 s
    # to one gap; one chunked step (budget 2048 holds the whole prompt) costs
    # 0.1 + 0.02 - 0.02 = 0.1 in place of a 0.02 step: it adds 0.08.
    stream = build_stream([Session(f"s{i}", 0.05 * i, (Round(100, 51),)) for i in range(21)], 0.05, 0.5)
    perf, chunked = StubPerf(), Batching("chunked", 2048)
    alternate = decode_cells(decode_replica(stream, perf, 1), 3, 0.05, "strict")
    mixed = decode_cells(decode_replica(stream, perf, 1, chunked), 3, 0.05, "strict")
    # k = 1: 10.5 local prefills/s; a pause needs 1.05 of the replica; chunks 0.84, but a gap
    # of 0.02 / 0.16 = 0.125 s would hold 1.3 of them: overloaded either way
    assert alternate[0].overloaded and "1.05 x the replica" in alternate[0].reason
    assert mixed[0].overloaded and "faster than decode steps" in mixed[0].reason
    # k = 2: u = 5.25 x 0.08 = 0.42, gap 0.02 / 0.58; a gap holds a chunk with probability
    # 5.25 x 0.0345 = 0.18 > 5 %: P95 = 0.02 + 0.08 = 0.1 (a pause: 0.12)
    assert alternate[1].p95_s == pytest.approx(0.12) and mixed[1].p95_s == pytest.approx(0.1)
    # mean scope: 0.02 / (1 - u), u = 5.25 x 0.08 and 3.5 x 0.08 (a pause: x 0.1)
    means = decode_cells(decode_replica(stream, perf, 1, chunked), 3, 0.05, "mean")
    assert [c.p95_s for c in means[1:]] == pytest.approx([0.02 / 0.58, 0.02 / 0.72])
    # a budget of 1 token: the batch of 1 takes it all, local prefills never start
    starved = decode_cells(decode_replica(stream, perf, 1, Batching("chunked", 1)), 2, 0.05, "mean")
    assert all(c.overloaded and "no room" in c.reason for c in starved)


def test_planner_chunked_steps_depend_on_the_batch():
    # One session every 10 s: never two at once, the batch is 1. Budget 51: a 100-token
    # prompt beside it runs as 2 steps of 50 tokens (0.05 s each, 0.03 beyond a step):
    # 0.06 per prefill against a pause's 0.1.
    stream = build_stream([Session(f"s{i}", 10.0 * i, (Round(100, 51),)) for i in range(11)], 0.05, 0.5)
    local_per_s = stream.prefills_per_s * 0.5
    mean = decode_cells(decode_replica(stream, StubPerf(), 1, Batching("chunked", 51)), 1, 0.05, "mean")[0]
    assert mean.p95_s == pytest.approx(0.02 / (1 - local_per_s * 0.06))
    paused = decode_cells(decode_replica(stream, StubPerf(), 1), 1, 0.05, "mean")[0]
    assert paused.p95_s == pytest.approx(0.02 / (1 - local_per_s * 0.1))
    assert np.isfinite(mean.p95_s) and mean.p95_s < paused.p95_s
