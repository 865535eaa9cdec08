"""The planner co-designed with the router, worked out by hand with the round-number
performance model of ``stub_perf`` (prefill 1 ms per new token, decode step 20 ms at any
batch, KV transfer 10 us per token between two workers): the router model in the
prefill queue, the local prefills it leaves each prefill side, and the consistent plans."""

import pytest

from ampd.core import Round, Session
from ampd.planner.codesign import co_designed_plans
from ampd.planner.queueing import PrefillChains, fcfs_ttft_s
from ampd.planner.tau import tau_sides
from ampd.policy.routing import SloThresholds
from queue_runs import listed
from stub_perf import StubPerf

# Pairs of one-round sessions 0.1 s apart, every 10 s: 500 new tokens (0.5 s of prefill,
# 5 ms to send back, no history to read), 2 output tokens. Window 0-40 s: all 8 prefills.
SESSIONS = [Session(f"s{i}", 10.0 * (i // 2) + 0.1 * (i % 2), (Round(500, 2),)) for i in range(8)]
# ITL threshold 21 ms: a 20 ms step alone is tau 0.952; TTFT threshold 1 s, alpha 0.9.
SLO = SloThresholds(ttft_s=1.0, itl_s=0.021)


def test_router_model_sends_a_task_locally_when_its_predicted_ttft_is_too_long():
    # 2 s prefills ready at 0, 0.5 and 1; the router runs locally above 2.5 s predicted.
    chains = PrefillChains([0.0, 0.5, 1.0], [0.0] * 3, [2.0] * 3, [0.0] * 3, [True] * 3, [0.0] * 3, [-1] * 3)
    # one replica busy 0-2: task 1 would wait 1.5 s (3.5 s predicted), task 2 1 s (3 s): both
    # local, at their own 2 s; being sent away from a busy replica counts as a wait
    assert listed(fcfs_ttft_s(chains, 1, 2.5)) == ([2.0, 2.0, 2.0], True, [False, True, True])
    # two replicas: task 1 finds one free (2 s predicted) and stays remote; task 2 would wait
    # for the first to free at 2 (1 + 2 = 3 s > 2.5): local, and a third replica would keep it
    assert listed(fcfs_ttft_s(chains, 2, 2.5)) == ([2.0, 2.0, 2.0], True, [False, False, True])
    assert listed(fcfs_ttft_s(chains, 3, 2.5)) == ([2.0, 2.0, 2.0], False, [False, False, False])
    # no router model: the same queue keeps everything remote and waits
    assert listed(fcfs_ttft_s(chains, 1)) == ([2.0, 3.5, 5.0], True, [False, False, False])


def test_each_prefill_side_records_the_local_prefills_it_induces():
    sides = tau_sides(SESSIONS, StubPerf(), SLO, 3, local_share=0.0, degrees=(1,), window_s=(0.0, 40.0))
    one, two = sides.prefill(0.9)
    # one replica: the second of a pair would wait 0.4 s, 0.4 + 0.5 + 0.005 = 0.905 s > 0.9 s:
    # local, TTFT 0.5 s; the first is remote, 0.505 s. P95 over 4 x 0.5 and 4 x 0.505: 0.505
    assert one.local_share == 0.5 and one.local_tasks == (1, 3, 5, 7) and one.p95_s == pytest.approx(0.505)
    # two replicas: nobody waits, nothing local
    assert two.local_share == 0.0 and two.local_tasks == () and two.p95_s == pytest.approx(0.505)


def test_the_fixed_point_picks_the_best_consistent_plan_by_hand():
    # Plans on 3 GPUs at TP 1: P1 D1, P1 D2, P2 D1. A decode replica's mean-scope ITL is
    # 20 ms / (1 - u), u = local prefills per second per replica x 0.5 s of pause each.
    # P1 sends 4 of 40 s's prefills locally (0.1/s): u = 0.05 on one decode replica,
    # 0.025 each on two; P2 sends none. tau_dec = ITL / 21 ms; tau_pre = 0.505 everywhere.
    design = co_designed_plans(tau_sides(SESSIONS, StubPerf(), SLO, 3, local_share=0.0, degrees=(1,),
                                         window_s=(0.0, 40.0)), 0.9, top_k=3)
    assert [str(p.deployment) for p in design.plans] == ["P:<TP=1,DP=2> D:<TP=1,DP=1>",
                                                          "P:<TP=1,DP=1> D:<TP=1,DP=2>",
                                                          "P:<TP=1,DP=1> D:<TP=1,DP=1>"]
    assert [p.objective for p in design.plans] == pytest.approx(
        [0.02 / 0.021, 0.02 / 0.975 / 0.021, 0.02 / 0.95 / 0.021])
    # the bound (no local prefills: every decode cell at 0.952) ranks P1 D1 first, the
    # fewest GPUs; P1 visited under its own local prefills falls to 0.977 and 1.003, so
    # P2 (no local prefills) is visited next and wins; nothing is left unvisited
    assert design.visits == (0.5, 0.0)
    assert [p.prefill.local_share for p in design.plans] == [0.0, 0.5, 0.5]
