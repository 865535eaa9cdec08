"""Algorithm 1 (AMPD.md section 3.1) on hand-made cluster views.
Costs from tests/stub_perf.py: prefill 1 ms/token, KV 10 us/token between workers."""

import random

import pytest

from ampd.policy.routing import AdaptiveRouter, AlwaysRemoteRouter, SloThresholds
from stub_perf import StubPerf
from views import decode, prefill, queued, task, view

SLO = SloThresholds(ttft_s=2.0, itl_s=0.1)  # alpha x 2.0 = 1.8 s, beta x 0.1 = 0.085 s


def router(seed=0):
    return AdaptiveRouter(StubPerf(), SLO, random.Random(seed), alpha=0.9, beta=0.85)


def test_step1_takes_a_prefill_worker_under_alpha_threshold():
    v = view(decode(0, itl=0.01), prefill(1, ttft=1.81), prefill(2, ttft=1.8))
    for seed in range(10):  # whatever the visiting order, only worker 2 qualifies (1.8 <= 1.8)
        d = router(seed).route(task(), v, 0.0)
        assert (d.worker_id, d.local, d.rule, d.basis_s) == (2, False, "prefill-window", 1.8)


def test_step1_random_order_spreads_over_qualifying_workers():
    v = view(decode(0), prefill(1, ttft=0.5), prefill(2, ttft=0.5), prefill(3, ttft=0.5))
    r = router(7)
    chosen = {r.route(task(), v, 0.0).worker_id for _ in range(30)}
    assert chosen == {1, 2, 3}


def test_idle_prefill_worker_reads_zero_and_qualifies():
    d = router().route(task(), view(decode(0), prefill(1, ttft=None)), 0.0)
    assert (d.worker_id, d.rule) == (1, "prefill-window")


def test_step2_local_when_decode_itl_under_beta_threshold():
    v = view(decode(0, itl=0.085), prefill(1, ttft=1.9))
    d = router().route(task(), v, 0.0)
    assert (d.worker_id, d.local, d.rule, d.basis_s) == (0, True, "decode-window", 0.085)


def test_step3_remote_estimate_wins():
    # t_local = 0.5 (own) + 0.3 (queued) = 0.8
    # worker 1: drain 0.2 + 0.4 = 0.6, read 1000 tok 0.01, prefill 0.5, send 500 tok 0.005 -> 1.115
    # worker 2: drain 0, read 0.01, prefill 0.5, send 0.005 -> 0.515
    v = view(decode(0, itl=0.2, queue=[queued(0.3)]),
             prefill(1, ttft=3.0, busy_s=0.2, queue=[queued(0.4)]), prefill(2, ttft=3.0))
    d = router().route(task(hist=1000, new=500), v, 0.0)
    assert (d.worker_id, d.local, d.rule) == (2, False, "estimate")
    assert d.basis_s == pytest.approx(0.515)
    assert dict(d.alternatives) == pytest.approx({0: 0.8, 1: 1.115, 2: 0.515})


def test_step3_local_estimate_wins():
    # t_local = 0.5; the only prefill worker: drain 1.0 + 0.515 = 1.515
    v = view(decode(0, itl=0.2), prefill(1, ttft=3.0, busy_s=1.0))
    d = router().route(task(hist=1000, new=500), v, 0.0)
    assert (d.worker_id, d.local, d.basis_s) == (0, True, pytest.approx(0.5))


def test_always_remote_picks_least_drain_and_never_local():
    v = view(decode(0), prefill(1, busy_s=0.3), prefill(2, busy_s=0.1, queue=[queued(0.1)]), prefill(3, busy_s=0.2))
    d = AlwaysRemoteRouter().route(task(), v, 0.0)
    assert (d.worker_id, d.local) == (2, False)  # drains 0.3, 0.2, 0.2: tie goes to the lowest id


def test_threshold_length_rule_flips_at_2048_uncached_tokens():
    from ampd.policy.routing import ThresholdRouter
    r = ThresholdRouter(length_rule=True)
    v = view(decode(0), prefill(1))
    # history 10000: ratio 2047/12047 = 0.17 < 0.7; 2047 < 2048 -> local; 2048 -> remote
    assert r.route(task(hist=10_000, new=2047), v, 0.0).local
    assert not r.route(task(hist=10_000, new=2048), v, 0.0).local
    # short but mostly uncached: 700 / (200 + 700) = 0.78 >= 0.7 -> remote (an initial prefill always is)
    assert not r.route(task(hist=200, new=700), v, 0.0).local
    assert not r.route(task(hist=0, new=100), v, 0.0).local


def test_threshold_busy_rule_and_the_or_of_both():
    from ampd.policy.routing import ThresholdRouter
    busy = view(decode(0), prefill(1, queue=[queued(0.1), queued(0.1)]), prefill(2, queue=[queued(0.1), queued(0.2)]))
    calm = view(decode(0), prefill(1, queue=[queued(0.1)]))
    r = ThresholdRouter(length_rule=False, busy_rule=True)
    d = r.route(task(hist=0, new=5000), busy, 0.0)
    assert (d.local, d.rule) == (True, "threshold-busy")  # the least loaded (worker 1) has 2 waiting
    assert r.route(task(hist=0, new=5000), calm, 0.0).worker_id == 1
    both = ThresholdRouter(length_rule=True, busy_rule=True)
    assert both.route(task(hist=10_000, new=500), calm, 0.0).rule == "threshold-length"
    assert both.route(task(hist=0, new=5000), busy, 0.0).rule == "threshold-busy"
    assert both.route(task(hist=0, new=5000), calm, 0.0).rule == "threshold-remote"


def test_dynamo_thresholds_come_from_the_configuration():
    from ampd.config import PolicyConfig
    from ampd.policy.systems import get_system
    knobs = PolicyConfig(dynamo_max_local_prefill_tokens=500, dynamo_max_uncached_ratio=0.9,
                         dynamo_busy_queue_tasks=1).knobs()
    v = view(decode(0), prefill(1, queue=[queued(0.1)]))
    length = get_system("dynamo-length").make_router(StubPerf(), SLO, knobs, random.Random(0))
    # 499 < 500 and 499 / (100 + 499) = 0.83 < 0.9 -> local; 500 tokens -> remote (default 2048 would keep both)
    assert length.route(task(hist=100, new=499), v, 0.0).local
    assert not length.route(task(hist=100, new=500), v, 0.0).local
    busy = get_system("dynamo-busy").make_router(StubPerf(), SLO, knobs, random.Random(0))
    assert busy.route(task(hist=0, new=5000), v, 0.0).rule == "threshold-busy"  # 1 waiting is busy at 1 (default 2)
    default = get_system("dynamo-conditional").make_router(StubPerf(), SLO, PolicyConfig().knobs(), random.Random(0))
    assert (default.max_local_prefill_tokens, default.max_uncached_ratio, default.busy_queue_tasks) == (2048, 0.7, 2)


def test_step3_counts_the_serving_path_of_each_option():
    # As test_step3_remote_estimate_wins behind a 0.3 s serving path per engine request: a
    # remote prefill makes two requests (+0.6), a local one one (+0.3): local's 0.8 + 0.3 = 1.1
    # now beats worker 2's 0.515 + 0.6 = 1.115.
    class Served(StubPerf):
        request_overhead_s = 0.3

    v = view(decode(0, itl=0.2, queue=[queued(0.3)]),
             prefill(1, ttft=3.0, busy_s=0.2, queue=[queued(0.4)]), prefill(2, ttft=3.0))
    d = AdaptiveRouter(Served(), SLO, random.Random(0), alpha=0.9, beta=0.85).route(task(hist=1000, new=500), v, 0.0)
    assert (d.worker_id, d.local, d.rule) == (0, True, "estimate")
    assert dict(d.alternatives) == pytest.approx({0: 0.8 + 0.3, 1: 1.115 + 0.6, 2: 0.515 + 0.6})
