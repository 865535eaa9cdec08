"""Deadline-aware queues (``DeadlineReorder``) on hand-made queues: TTFT threshold
1.0 s, now 0, so a task's deadline is its ready time + 1.0."""

import pytest

from ampd.config import EngineWorker, RunConfig, ServeConfig
from ampd.policy.deadline import DeadlineReorder
from ampd.policy.reorder import TtftAwareReorder, apply_order
from ampd.policy.routing import SloThresholds
from ampd.policy.systems import Knobs, get_system
from ampd.serve.build import build_coordinator
from views import queued

# A: cost 0.6, deadline 0.8; B: cost 0.3, deadline 0.9; C: cost 0.2, deadline 1.0; D: cost 0.1, deadline 1.0.
# Deadline order A, B, C, D from 0: A ends 0.6 <= 0.8; B 0.9 <= 0.9; C 1.1 > 1.0, so the longest kept (A, 0.6)
# is dropped: 0.5; D ends 0.6 <= 1.0. Kept B, C, D: three on time, B first.
# FCFS: A 0.6, B 0.9 on time, C 1.1 and D 1.2 late: two.


def _abcd(postponed=(0, 0, 0, 0)):
    return [queued(0.6, -0.2, postponed[0], "A"), queued(0.3, -0.1, postponed[1], "B"),
            queued(0.2, 0.0, postponed[2], "C"), queued(0.1, 0.0, postponed[3], "D")]


def _names(queue):
    return [q.task.session_id for q in queue]


def test_most_tasks_on_time_in_deadline_order():
    d = DeadlineReorder(1.0, 3).pick(_abcd(), 0.0)
    assert d.order == (1, 0) and d.on_time == 3
    after = apply_order(_abcd(), d)
    assert _names(after) == ["B", "A", "C", "D"]
    assert [q.postponements for q in after] == [0, 1, 0, 0]


def test_algorithm_2_window_cannot_see_the_fourth_task():
    # Over A, B, C every order has at most two on time (B, C, A: A ends 1.1 > 0.8); the tie keeps A first.
    d = TtftAwareReorder(1.0, window=3).pick(_abcd(), 0.0)
    assert d.order == (0, 1, 2) and d.on_time == 2


def test_postponed_k_times_goes_first():
    assert DeadlineReorder(1.0, max_postponements=3).pick(_abcd((3, 0, 0, 0)), 0.0).order == (0,)
    # C has reached the bound: it goes first, passing A and B.
    assert DeadlineReorder(1.0, max_postponements=3).pick(_abcd((0, 0, 3, 0)), 0.0).order == (2, 0, 1)


def test_first_starved_task_is_chosen_so_no_other_starved_task_is_postponed():
    d = DeadlineReorder(1.0, max_postponements=2).pick(_abcd((0, 2, 0, 2)), 0.0)
    assert d.order == (1, 0)  # B; D keeps its place and its counter
    assert [q.postponements for q in apply_order(_abcd((0, 2, 0, 2)), d)] == [2, 1, 0, 2]


def test_a_task_past_its_deadline_goes_behind_one_that_can_meet_it():
    # H: cost 0.3, deadline 0.1: ends 0.3, late, dropped. F: cost 0.5, deadline 1.0: on time.
    q = [queued(0.3, -0.9, 0, "H"), queued(0.5, 0.0, 0, "F")]
    d = DeadlineReorder(1.0, 3).pick(q, 0.0)
    assert d.order == (1, 0) and d.on_time == 1


def test_when_no_task_can_meet_its_deadline_the_oldest_runs():
    # X: cost 0.5, deadline 0.2; Y: cost 0.4, deadline 0.1. Both late whatever the order.
    q = [queued(0.5, -0.8, 0, "X"), queued(0.4, -0.9, 0, "Y")]
    d = DeadlineReorder(1.0, 3).pick(q, 0.0)
    assert d.order == (0,) and d.on_time == 0


def test_start_delay_counts_in_completion():
    # P: cost 0.4, deadline 0.5; Q: cost 0.1, deadline 1.0.
    q = [queued(0.4, -0.5, 0, "P"), queued(0.1, 0.0, 0, "Q")]
    assert DeadlineReorder(1.0, 3).pick(q, 0.0).order == (0,)  # P ends 0.4, Q 0.5: both on time
    assert DeadlineReorder(1.0, 3).pick(q, 0.0, start_delay_s=0.2).order == (1, 0)  # P would end 0.6 > 0.5


def test_equal_deadlines_keep_queue_order():
    q = [queued(0.2, 0.0, 0, "A"), queued(0.1, 0.0, 0, "B")]
    assert DeadlineReorder(1.0, 3).pick(q, 0.0).order == (0,)


def test_empty_queue_and_bad_bound():
    assert DeadlineReorder(1.0, 3).pick([], 0.0).order == ()
    with pytest.raises(ValueError):
        DeadlineReorder(1.0, max_postponements=0)


def test_system_builds_it_from_the_slo_and_the_window():
    policy = get_system("ampd-predictive-edf").make_queue_policy(SloThresholds(ttft_s=1.5, itl_s=0.05),
                                                                 Knobs(max_postponements=4))
    assert isinstance(policy, DeadlineReorder)
    assert (policy.ttft_threshold_s, policy.max_postponements) == (1.5, 4)


def test_serving_builds_it_from_the_configuration():
    workers = [EngineWorker(url="http://127.0.0.1:9", role="prefill"),
               EngineWorker(url="http://127.0.0.1:9", role="decode")]
    config = RunConfig(system="ampd-predictive-edf", policy={"max_postponements": 7},
                       slo={"ttft_s": 1.5, "itl_s": 0.05},
                       cluster={"model": "Llama-3.1-8B", "gpu": "H100-SXM", "num_gpus": 2,
                                "deployment": "P:<TP=1,DP=1> D:<TP=1,DP=1>"},
                       workload={"name": "toolbench", "num_sessions": 5}, serve=ServeConfig(workers=workers))
    policy = build_coordinator(config, "test").dispatcher.queue_policy
    assert isinstance(policy, DeadlineReorder)
    assert (policy.ttft_threshold_s, policy.max_postponements) == (1.5, 7)
