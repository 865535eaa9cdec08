"""Binding by free KV memory and the sliding-window mean."""

from ampd.policy.binding import MostFreeKvBinder
from ampd.policy.window import SlidingWindowMean
from views import decode, prefill, view


def test_binds_to_most_free_kv_and_ignores_prefill_workers():
    v = view(decode(0, free=100, capacity=400), decode(1, free=300, capacity=400), prefill(2),
             decode(3, free=200, capacity=400))
    d = MostFreeKvBinder().bind("s", 50, v)
    assert (d.worker_id, d.kv_free_tokens) == (1, 300)


def test_replicas_of_two_degrees_are_filled_to_the_same_share_of_their_capacity():
    # A TP=4 replica of 3,000 tokens and a TP=2 one of 1,000: 600 free of 1,000 (60 %) beats
    # 1,500 free of 3,000 (50 %), though fewer tokens; at 1,000 free of 1,000 and 3,000 of
    # 3,000 (a tie of shares) the lower id. Sessions of 100 tokens, bound one at a time from
    # empty, leave the two at 3:1 of the tokens, their capacities' ratio.
    binder = MostFreeKvBinder()
    assert binder.bind("s", 100, view(decode(0, free=1500, capacity=3000), decode(1, free=600, capacity=1000,
                                                                                tp=2))).worker_id == 1
    used = {0: 0, 1: 0}
    for i in range(40):
        v = view(decode(0, free=3000 - used[0], capacity=3000), decode(1, free=1000 - used[1], capacity=1000, tp=2))
        used[binder.bind(f"s{i}", 100, v).worker_id] += 100
    assert used == {0: 3000, 1: 1000}


def test_bind_tie_goes_to_lowest_id_and_none_when_full():
    v = view(decode(0, free=200), decode(1, free=200))
    assert MostFreeKvBinder().bind("s", 200, v).worker_id == 0
    assert MostFreeKvBinder().bind("s", 201, v) is None


def test_window_mean_drops_old_samples():
    w = SlidingWindowMean(10.0)
    assert w.mean(0.0) is None
    w.add(0.0, 1.0)
    w.add(5.0, 3.0, count=3)
    assert w.mean(9.9) == (1.0 + 9.0) / 4
    assert w.mean(10.0) == 3.0  # the sample at 0 s is exactly window_s old: out
    assert w.mean(15.0) is None
