"""``ampd-slo`` (``ampd.policy.slo_routing``) on hand-made views, and the simulator's
decode worker running the chunk it chooses, worked out by hand with
``stub_perf.AlphaBetaStub``: prefill 10 ms + 1 ms per new token + 0.1 ms per history
token, decode step 20 ms + 2 ms per sequence (context free), KV transfer 10 us per
token between two workers."""

import dataclasses
import math

import pytest

from ampd.core import ClusterView, Deployment, Round, Session
from ampd.policy.batching import Batching
from ampd.policy.decisions import RouteDecision
from ampd.policy.reorder import Fcfs
from ampd.policy.routing import SloThresholds
from ampd.policy.slo_routing import SloRouter
from ampd.policy.systems import get_system
from ampd.sim.cluster import SimCluster, WorkerOptions
from stub_perf import AlphaBetaStub
from views import decode, prefill, queued, task, view

CHUNKED = Batching("chunked", 2048)


def _batch(worker, batch_size=4, slack_s=None, queue=()):
    """``worker`` (a decode view) with ``batch_size`` sequences decoding, the tightest
    of them ``slack_s`` of ITL slack."""
    return dataclasses.replace(worker, batch_size=batch_size, context_tokens=0, min_itl_slack_s=slack_s,
                               queue=tuple(queue))


def test_a_local_prefill_that_would_break_the_batch_itl_budget_is_refused():
    # No slack is credited ahead (horizon 0) here: the slack is the view's. The engine pauses the batch (alternate). Task: 500 new tokens on 1,000 of history.
    # Local: T_pre(1000, 500) = 0.01 + 0.5 + 0.1 = 0.61 s, TTFT 0.61 <= 0.9 x 1.0: it would
    # meet the TTFT SLO. The batch of 4 (step T_dec(4) = 0.028) sees one gap of
    # 0.028 + 0.61 = 0.638 s, spending 0.638 - 0.05 = 0.588 s of its tightest session's slack.
    # Remote: worker 1 is busy 2 s, then reads 1,000 tokens (0.01), prefills (0.61), returns
    # 500 (0.005): TTFT 2.625, a miss. Slack 0.5 < 0.588 -> local refused; no option meets the
    # SLO and ITL-safely, so the degradation takes the ITL-safe one: remote.
    router = SloRouter(AlphaBetaStub(), SloThresholds(1.0, 0.05), 0.9, Batching(), slack_horizon_tokens=0)
    cluster = view(_batch(decode(0), slack_s=0.5), prefill(1, busy_s=2.0, server=1))
    d = router.route(task(hist=1000, new=500), cluster, 0.0)
    assert (d.worker_id, d.local, d.rule) == (1, False, "slo-degraded")
    assert d.basis_s == pytest.approx(2.625)
    assert d.alternatives[0] == (0, math.inf)  # local: not ITL-safe
    # With 0.6 s of slack the same local prefill fits (0.588 <= 0.6) and meets the SLO.
    cluster = view(_batch(decode(0), slack_s=0.6), prefill(1, busy_s=2.0, server=1))
    d = router.route(task(hist=1000, new=500), cluster, 0.0)
    assert (d.worker_id, d.local, d.rule, d.chunk_tokens) == (0, True, "slo-local", None)
    assert d.basis_s == pytest.approx(0.61)


def test_a_session_is_credited_the_slack_its_next_tokens_earn():
    # As above (0.5 s of slack, 0.588 s of damage: refused without credit), with the default
    # horizon of 32 tokens: each of them decoded at T_dec(4) = 0.028 s earns 0.05 - 0.028 =
    # 0.022 s, 0.704 s in all; 0.5 + 0.704 = 1.204 >= 0.588: the local prefill is safe.
    router = SloRouter(AlphaBetaStub(), SloThresholds(1.0, 0.05), 0.9, Batching())
    assert router.slack_s(_batch(decode(0), slack_s=0.5)) == pytest.approx(1.204)
    cluster = view(_batch(decode(0), slack_s=0.5), prefill(1, busy_s=2.0, server=1))
    d = router.route(task(hist=1000, new=500), cluster, 0.0)
    assert (d.worker_id, d.local, d.rule) == (0, True, "slo-local")
    # A horizon of 4 tokens earns 4 x 0.022 = 0.088 s; a step slower than the threshold earns
    # nothing (a batch of 20: T_dec = 0.02 + 0.04 = 0.06 > 0.05), so -0.1 s stays -0.1.
    assert SloRouter(AlphaBetaStub(), SloThresholds(1.0, 0.05), slack_horizon_tokens=4).slack_s(
        _batch(decode(0), slack_s=0.5)) == pytest.approx(0.588)
    assert router.slack_s(_batch(decode(0), batch_size=20, slack_s=-0.1)) == pytest.approx(-0.1)
    # Unknown slack (the coordinator's view, the strict scope) is 0 and earns no credit.
    assert router.slack_s(_batch(decode(0), slack_s=None)) == 0.0


def test_the_local_chunk_is_the_largest_the_batch_slack_allows():
    # No slack credited ahead (horizon 0). ITL threshold 0.2 s; the batch: 4 sequences (T_dec(4) = 0.028 s), tightest slack
    # 0.06255 s. Task: 400 new tokens, no history. A chunk of c tokens on h done is a mixed step
    # T_pre(h, c) + T_dec(4) - T_dec(1) = 0.01 + 0.001 c + 0.0001 h + 0.006, a gap of that
    # length, spending (step - 0.2) of the slack:
    #  - c = 400 (one step): 0.416 - 0.2 = 0.216 > 0.06255: unsafe;
    #  - c in [200, 399] (two steps, h = 0 then c): 0.016 + 0.001 c - 0.2
    #    + 0.016 + 0.001 (400 - c) + 0.0001 c - 0.2 = 0.032 + 0.0001 c <= 0.06255 for c <= 305.5;
    #  - fewer tokens per step spend less (three steps: -0.152 + 0.0003 c < 0).
    # Largest safe chunk: 305, run as 305 then 95: steps 0.321 and 0.1415, TTFT 0.4625.
    router = SloRouter(AlphaBetaStub(), SloThresholds(1.0, 0.2), 0.9, CHUNKED, slack_horizon_tokens=0)
    cluster = view(_batch(decode(0), slack_s=0.06255), prefill(1, busy_s=5.0, server=1))
    d = router.route(task(hist=0, new=400), cluster, 0.0)
    assert (d.worker_id, d.local, d.rule, d.chunk_tokens) == (0, True, "slo-local", 305)
    assert d.basis_s == pytest.approx(0.4625)
    # Served, the engine's budget is engine-wide: the estimate runs the task in one
    # 400-token step (0.416 s: TTFT met, 0.216 s of slack: unsafe), and the decision
    # carries no chunk; remote still misses, so the degradation goes remote.
    served = SloRouter(AlphaBetaStub(), SloThresholds(1.0, 0.2), 0.9, CHUNKED, per_task_chunks=False,
                       slack_horizon_tokens=0)
    d = served.route(task(hist=0, new=400), cluster, 0.0)
    assert (d.local, d.rule, d.chunk_tokens) == (False, "slo-degraded", None)


def test_queued_local_prefills_spend_the_slack_first():
    # As the chunk test, with a 100-token local prefill queued ahead in 100-token chunks:
    # one step of 0.016 + 0.1 = 0.116 s, spending 0.116 - 0.2 = -0.084 (it gains slack).
    # Left: 0.06255 + 0.084 = 0.14655 -> 0.032 + 0.0001 c <= 0.14655 for every two-step
    # chunk; one step of 400 (0.216) is still too much: 399, after the 0.116 s ahead.
    # TTFT: 0.116 + (0.016 + 0.399) + (0.016 + 0.001 + 0.0399) = 0.5879.
    router = SloRouter(AlphaBetaStub(), SloThresholds(1.0, 0.2), 0.9, CHUNKED, slack_horizon_tokens=0)
    ahead = dataclasses.replace(queued(0.11), task=task("q", hist=0, new=100), chunk_tokens=100)
    cluster = view(_batch(decode(0), slack_s=0.06255, queue=[ahead]), prefill(1, busy_s=5.0, server=1))
    d = router.route(task(hist=0, new=400), cluster, 0.0)
    assert (d.local, d.chunk_tokens) == (True, 399)
    assert d.basis_s == pytest.approx(0.5879)


def test_remote_first_when_it_meets_the_slo():
    # Worker 2: idle, TTFT 0.01 + 0.61 + 0.005 = 0.625 <= 0.9; worker 1 busy 0.1 s more.
    # Local would be faster (0.61) and the batch empty, but a remote that meets the SLO wins.
    router = SloRouter(AlphaBetaStub(), SloThresholds(1.0, 0.05), 0.9, CHUNKED)
    cluster = view(decode(0), prefill(1, busy_s=0.1, server=1), prefill(2, server=1))
    d = router.route(task(hist=1000, new=500), cluster, 0.0)
    assert (d.worker_id, d.local, d.rule) == (2, False, "slo-remote")
    assert d.basis_s == pytest.approx(0.625)


def test_degradation_takes_the_fastest_itl_safe_option():
    # The round has waited 1 s already: nothing meets 0.9. Empty batch: local is ITL-safe,
    # TTFT 1 + 0.61 = 1.61 (one 500-token chunk, no batch: T_pre alone); remote 1 + 0.625
    # on worker 2 (worker 1 busy 3 s): local wins.
    router = SloRouter(AlphaBetaStub(), SloThresholds(1.0, 0.05), 0.9, CHUNKED)
    cluster = view(decode(0), prefill(1, busy_s=3.0, server=1), prefill(2, server=1))
    d = router.route(task(hist=1000, new=500, ready_s=0.0), cluster, 1.0)
    assert (d.worker_id, d.local, d.rule) == (0, True, "slo-degraded")
    assert d.basis_s == pytest.approx(1.61)
    assert [w for w, _ in d.alternatives] == [0, 2, 1]
    assert [t for _, t in d.alternatives] == pytest.approx([1.61, 1.625, 4.625])
    # No prefill worker and a batch whose slack no chunk fits (-1 s): local anyway, in the
    # least damaging chunk (the 32-token floor: thirteen steps, each under the threshold).
    d = router.route(task(hist=1000, new=500), view(_batch(decode(0), slack_s=-1.0)), 0.0)
    assert (d.local, d.rule) == (True, "slo-degraded")


def test_ampd_slo_is_registered_as_an_adaptive_chunked_system():
    system = get_system("ampd-slo")
    assert system.adaptive and system.batching == "chunked" and not system.needs_prefill_workers


class _LocalInChunks:
    """Every prefill local, in 100-token chunks; records the view C is routed with."""

    def __init__(self) -> None:
        self.views: dict[str, ClusterView] = {}

    def route(self, t, cluster, now_s):
        self.views[t.session_id] = cluster
        return RouteDecision(t.session_id, t.round_index, t.decode_worker, True, "test", chunk_tokens=100)


def test_the_decode_worker_runs_the_decision_chunk_and_reports_the_batch_slack():
    # As tests/test_sim_engine_batching.py's chunked case, but with the engine's budget at 2,048
    # and the decision's chunk at 100: A (50 tokens) alone 0-0.06; B beside A in one mixed
    # step 0.06-0.12 (A's first gap 0.06); a step of 2 (0.024) 0.12-0.144; C (300 tokens,
    # arrived 0.13) in 100-token steps of 0.112, 0.122, 0.132: first token 0.510.
    router = _LocalInChunks()
    sessions = [Session("a", 0.0, (Round(50, 30),)), Session("b", 0.0, (Round(50, 30),)),
                Session("c", 0.13, (Round(300, 2),))]
    cluster = SimCluster(Deployment.parse("D:<TP=1,DP=1>").workers(8), AlphaBetaStub(), router, Fcfs(),
                         WorkerOptions(10.0, CHUNKED, itl_slo_s=0.05))
    rounds = {s.session_id: s.rounds[0] for s in cluster.run(sessions).sessions}
    assert rounds["c"].first_token_s == pytest.approx(0.510)
    assert list(rounds["a"].itls_s)[:6] == pytest.approx([0.06, 0.024, 0.112, 0.122, 0.132, 0.026])
    # When C is routed (0.13) A has had one gap of 0.06 (slack 0.05 - 0.06 = -0.01); B is in
    # its first step (slack 0, as it came).
    assert router.views["c"].worker(0).min_itl_slack_s == pytest.approx(-0.01)
