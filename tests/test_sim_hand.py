"""The simulator on tiny cases worked out by hand (times from tests/stub_perf.py)."""

import dataclasses
import random

import pytest

from ampd.core import Deployment, Round, Session
from ampd.core.task import PrefillTask
from ampd.perf.interface import RemoteStages
from ampd.planner.prefill_tau import prefill_chains
from ampd.planner.queueing import fcfs_ttft_s
from ampd.planner.stream import build_stream
from ampd.policy.reorder import Fcfs
from ampd.policy.routing import AdaptiveRouter, AlwaysRemoteRouter, SloThresholds, remote_estimate_s
from ampd.sim.cluster import SimCluster
from stub_perf import StubPerf


def _cluster(deployment: str, router, perf=None) -> SimCluster:
    specs = Deployment.parse(deployment).workers(8)
    return SimCluster(specs, perf or StubPerf(), router, Fcfs())


def test_two_rounds_one_tool_call_remote():
    # Round 0: prefill 1000 tok = 1.0 s on P, new KV back 1000 x 10 us = 0.01 s -> first token 1.01.
    # Two decode steps of 20 ms -> done 1.05. Tool 2.0 s -> round 1 ready at 3.05.
    # Round 1: lazy history read of 1003 tokens = 0.01003 s, prefill 500 = 0.5 s,
    # new KV back 500 x 10 us = 0.005 s -> first token 3.56503; one step -> done 3.58503.
    session = Session("s", 0.0, (Round(1000, 3, 2.0), Round(500, 2)))
    result = _cluster("P:<TP=1,DP=1> D:<TP=1,DP=1>", AlwaysRemoteRouter()).run([session])
    r0, r1 = result.sessions[0].rounds
    assert r0.first_token_s == pytest.approx(1.01)
    assert list(r0.itls_s) == pytest.approx([0.02, 0.02])
    assert r0.done_s == pytest.approx(1.05)
    assert r1.ready_s == pytest.approx(3.05)
    assert r1.hist_tokens == 1003
    assert r1.first_token_s == pytest.approx(3.56503)
    assert r1.ttft_s == pytest.approx(0.51503)
    assert r1.done_s == pytest.approx(3.58503)
    assert result.sessions[0].done_s == pytest.approx(3.58503)
    assert not r0.local and not r1.local and r1.prefill_worker == 0


def test_local_prefill_delays_running_decode_by_its_prefill_time():
    # No prefill worker: Algorithm 1 runs everything locally (empty ITL window reads 0).
    # A: prefill 1.0 s -> first token 1.0; steps end 1.02, 1.04, ...
    # B arrives 1.03 (mid-step), prefill 0.1 s runs 1.04-1.14 between two steps,
    # so A's next gap is 0.02 + 0.1 = 0.12; B joins the step 1.14-1.16.
    router = AdaptiveRouter(StubPerf(), SloThresholds(5.0, 0.05), random.Random(0))
    a = Session("a", 0.0, (Round(1000, 5),))
    b = Session("b", 1.03, (Round(100, 2),))
    result = _cluster("D:<TP=1,DP=1>", router).run([a, b])
    ra, rb = (s.rounds[0] for s in result.sessions)
    assert list(ra.itls_s) == pytest.approx([0.02, 0.02, 0.12, 0.02])
    assert rb.first_token_s == pytest.approx(1.14)
    assert list(rb.itls_s) == pytest.approx([0.02])
    assert ra.done_s == pytest.approx(1.18)
    assert ra.local and rb.local


def test_remote_history_read_overlaps_previous_compute():
    # Two sessions both in their second round arrive at the prefill worker together.
    # Task X (hist 1003) is read (0.01003 s) while nothing computes; task Y's read of
    # 2003 tokens (0.02003 s) overlaps X's compute, so Y computes right after X.
    x = Session("x", 0.0, (Round(1000, 3, 1.0), Round(500, 2)))
    y = Session("y", 0.0, (Round(2000, 3, 0.0), Round(500, 2)))
    # Timeline on P: x0 compute 0-1.0, y0 read 0 (hist 0), compute 1.0-3.0.
    # x0 KV back 1.01; decode D: x steps 1.01-1.03-1.05 -> x round 0 done 1.05, x1 ready 2.05.
    # y0 KV back (2000 x 10us) 3.02; y steps 3.02-3.04-3.06 -> y1 ready 3.06.
    # x1 enqueued at 2.05 while y0 computes: read 1003 tok 2.05-2.06003, compute starts 3.0, ends 3.5.
    result = _cluster("P:<TP=1,DP=1> D:<TP=1,DP=1>", AlwaysRemoteRouter()).run([x, y])
    x1 = result.sessions[0].rounds[1]
    y1 = result.sessions[1].rounds[1]
    assert x1.ready_s == pytest.approx(2.05)
    assert x1.first_token_s == pytest.approx(3.0 + 0.5 + 0.005)
    # y1 ready 3.06: read 2003 tok (0.02003) overlaps x1's compute (ends 3.5); computes 3.5-4.0.
    assert y1.first_token_s == pytest.approx(4.0 + 0.005)


class ServedStub(StubPerf):
    """StubPerf behind a serving path of 50 ms per engine request."""

    request_overhead_s = 0.05


def test_the_serving_path_adds_two_requests_to_a_remote_round_and_one_to_a_local_one():
    # As test_two_rounds_one_tool_call_remote, each engine request 50 ms later: round 0 reaches
    # the prefill engine at 0.05, is computed and its KV back at 1.06, and the decode engine's
    # request takes its 50 ms: first token 1.11, two steps: done 1.15; round 1 ready at 3.15.
    session = Session("s", 0.0, (Round(1000, 3, 2.0), Round(500, 2)))
    cluster = _cluster("P:<TP=1,DP=1> D:<TP=1,DP=1>", AlwaysRemoteRouter(), ServedStub())
    r0, r1 = cluster.run([session]).sessions[0].rounds
    assert r0.first_token_s == pytest.approx(1.01 + 2 * 0.05)
    assert r0.done_s == pytest.approx(1.15)
    assert r1.ttft_s == pytest.approx(0.51503 + 2 * 0.05)
    # The prefill worker's TTFT window counts both requests, as the rounds' TTFTs do
    assert cluster.workers[0].ttft_window.mean(r1.first_token_s) == pytest.approx((r0.ttft_s + r1.ttft_s) / 2)
    # Local (no prefill worker): one request, to the decode engine; prefill 1.0 s from 0.05
    router = AdaptiveRouter(ServedStub(), SloThresholds(5.0, 0.05), random.Random(0))
    (local,) = _cluster("D:<TP=1,DP=1>", router, ServedStub()).run([Session("a", 0.0, (Round(1000, 2),))]).sessions
    assert local.rounds[0].local and local.rounds[0].first_token_s == pytest.approx(1.05)


def test_a_prefill_queue_policy_counts_the_decode_engines_request_after_each_task():
    # Two sessions reach an idle prefill worker at 0.05 (their request's 50 ms): the first is
    # read and computed at once, the second picked from the queue when the read stage frees,
    # with the first's compute (1.0 s) still running. The policy is told the tasks start
    # after that compute, plus the 50 ms the decode engine's request adds to every one.
    seen = []

    class Spy(Fcfs):
        def pick(self, queue, now_s, start_delay_s=0.0):
            seen.append((now_s, start_delay_s))
            return super().pick(queue, now_s, start_delay_s)

    specs = Deployment.parse("P:<TP=1,DP=1> D:<TP=1,DP=1>").workers(8)
    sessions = [Session("a", 0.0, (Round(1000, 2),)), Session("b", 0.0, (Round(1000, 2),))]
    SimCluster(specs, ServedStub(), AlwaysRemoteRouter(), Spy()).run(sessions)
    assert seen[0] == pytest.approx((0.05, 0.05))  # nothing computing: only the request
    assert seen[1] == pytest.approx((0.05, 1.0 + 0.05))  # a's compute ahead, then the request


class MeasuredPathStub(ServedStub):
    """ServedStub whose remote rounds take measured engine requests (a profile's
    ``RemotePath``): the history export 30 ms (its serving path in it) and the prefill
    engine's request 200 ms, both holding the prefill worker, then the decode engine's
    join 40 ms, whatever the sizes."""

    def remote_stages_s(self, hist_tokens, new_tokens, prefill, decode):
        return RemoteStages(0.0, (0.03 if hist_tokens else 0.0) + 0.2, 0.04)

    def measured_remote_path(self, tp):
        return True


def _measured_session(session_id: str, arrival_s: float) -> Session:
    return Session(session_id, arrival_s, (Round(1000, 3, 2.0), Round(500, 2)))


def test_a_measured_remote_path_times_the_round_by_its_engine_requests():
    # Round 0 (no history, no export): its request reaches the prefill engine at 0.05, the
    # prefill request takes 0.2, the join 0.04 and the decode request's path 0.05: 0.34.
    # Two 20 ms steps: done 0.38; round 1 ready at 2.38: 0.05 + export 0.03 + 0.2 + 0.04 + 0.05.
    cluster = _cluster("P:<TP=1,DP=1> D:<TP=1,DP=1>", AlwaysRemoteRouter(), MeasuredPathStub())
    r0, r1 = cluster.run([_measured_session("s", 0.0)]).sessions[0].rounds
    assert r0.first_token_s == pytest.approx(0.34)
    assert r1.ready_s == pytest.approx(2.38)
    assert r1.ttft_s == pytest.approx(0.37)
    # The router's estimate on the idle cluster is that TTFT: no queue, the three stages and
    # the prefill and decode requests' paths (the export's is in its stage).
    view = cluster.view()
    task = PrefillTask("t", 1, r1.hist_tokens, r1.new_tokens, 0.0, 1)
    assert remote_estimate_s(task, view.workers[1], view.workers[0], MeasuredPathStub()) == pytest.approx(0.37)
    # The planner's queue times the same rounds alike (two such sessions 100 s apart).
    stream = build_stream([_measured_session("a", 0.0), _measured_session("b", 100.0)], itl_s=0.02,
                          local_share=0.0)
    chains = prefill_chains(stream, MeasuredPathStub(), 1, cross_server=False)
    assert fcfs_ttft_s(chains, 1).ttft_s.tolist() == pytest.approx([0.34, 0.37, 0.34, 0.37])
    # Run on their decode replica the same rounds make no remote requests: the request's path
    # and T_pre (1 ms per new token): 1.05 and 0.55 s.
    local = dataclasses.replace(chains, remote=[False] * 4)
    assert fcfs_ttft_s(local, 1).ttft_s.tolist() == pytest.approx([1.05, 0.55, 1.05, 0.55])


def test_with_a_measured_remote_path_the_next_task_is_picked_when_the_worker_frees():
    # Serving sends the export from the prefill worker's one slot, so nothing is read ahead:
    # b is picked when a's 0.2 s ends (0.25), not when it starts (0.05) as a lazy read would.
    seen = []

    class Spy(Fcfs):
        def pick(self, queue, now_s, start_delay_s=0.0):
            seen.append(now_s)
            return super().pick(queue, now_s, start_delay_s)

    specs = Deployment.parse("P:<TP=1,DP=1> D:<TP=1,DP=1>").workers(8)
    sessions = [Session("a", 0.0, (Round(1000, 2),)), Session("b", 0.0, (Round(1000, 2),))]
    SimCluster(specs, MeasuredPathStub(), AlwaysRemoteRouter(), Spy()).run(sessions)
    assert seen == pytest.approx([0.05, 0.25])
