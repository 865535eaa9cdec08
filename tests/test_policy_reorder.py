"""Algorithm 2 (AMPD.md section 3.2) on hand-made queues, TTFT threshold 1.0 s, now 0."""

import pytest

from ampd.policy.reorder import Fcfs, TtftAwareReorder, apply_order
from views import queued

# A: cost 0.5, waited 0.4; B: cost 0.3, waited 0; C: cost 0.1, waited 0.85.
# Order A,B,C: A .4+.5=.9 ok, B 0+.8 ok, C .85+.9 late        -> 2 on time
# Order C,A,B: C .85+.1=.95 ok, A .4+.6=1.0 ok, B 0+.9 ok    -> 3 (the only order with 3)
# Order A,C,B: 2; C,B,A: 2; B,A,C: 1; B,C,A: 1.


def _abc(a_postponed=0):
    return [queued(0.5, -0.4, a_postponed, "A"), queued(0.3, 0.0, 0, "B"), queued(0.1, -0.85, 0, "C")]


def test_best_permutation_is_chosen():
    d = TtftAwareReorder(1.0, window=3).pick(_abc(), 0.0)
    assert d.order == (2, 0, 1) and d.on_time == 3


def test_apply_order_counts_postponements():
    q = apply_order(_abc(), TtftAwareReorder(1.0, 3).pick(_abc(), 0.0))
    assert [x.task.session_id for x in q] == ["C", "A", "B"]
    assert [x.postponements for x in q] == [0, 1, 1]  # A moved 0->1, B moved 1->2, C moved earlier


def test_permutation_postponing_an_exhausted_task_is_skipped_and_tie_keeps_order():
    # A has been postponed w=3 times: only orders with A first remain, A,B,C and A,C,B,
    # both with 2 on time: the tie keeps the current order.
    d = TtftAwareReorder(1.0, window=3).pick(_abc(a_postponed=3), 0.0)
    assert d.order == (0, 1, 2) and d.on_time == 2


def test_all_on_time_keeps_order():
    q = [queued(0.1, 0.0, 0, "A"), queued(0.1, 0.0, 0, "B"), queued(0.1, 0.0, 0, "C")]
    assert TtftAwareReorder(1.0, 3).pick(q, 0.0).order == (0, 1, 2)


def test_window_limits_the_head_and_tail_stays():
    # w=2 over A,B only: A,B -> 2 on time; B,A -> B ok, A .4+.8 late -> 1. Keep A,B; C stays third.
    d = TtftAwareReorder(1.0, window=2).pick(_abc(), 0.0)
    assert d.order == (0, 1)
    assert [x.task.session_id for x in apply_order(_abc(), d)] == ["A", "B", "C"]


def test_start_delay_counts_in_completion():
    # With 0.2 s of work ahead: A,B,C: A .4+.7 late, B 0+1.0 ok, C late -> 1;
    # C,B,A: C .85+.3 late, B .6 ok, A .4+1.1 late -> 1; B,A,C: B .5 ok, A, C late -> 1;
    # B,C,A: B ok, C .85+.6 late, A late -> 1; A,C,B: A 1.1, C 1.65, B 1.1 all late -> 0;
    # C,A,B: C 1.15, A 1.2, B 1.1 all late -> 0. Best is 1, first reached by the identity.
    d = TtftAwareReorder(1.0, 3).pick(_abc(), 0.0, start_delay_s=0.2)
    assert d.order == (0, 1, 2) and d.on_time == 1


def test_fcfs_keeps_the_queue():
    d = Fcfs().pick(_abc(), 0.0)
    assert apply_order(_abc(), d) == _abc()


def test_window_must_be_positive():
    with pytest.raises(ValueError):
        TtftAwareReorder(1.0, window=0)
