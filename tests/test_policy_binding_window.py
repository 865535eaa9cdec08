"""Binding by free KV memory and the sliding-window mean."""

from ampd.policy.binding import MostFreeKvBinder
from ampd.policy.window import SlidingWindowMean
from views import decode, prefill, view


def test_binds_to_most_free_kv_and_ignores_prefill_workers():
    v = view(decode(0, free=100), decode(1, free=300), prefill(2), decode(3, free=200))
    d = MostFreeKvBinder().bind("s", 50, v)
    assert (d.worker_id, d.kv_free_tokens) == (1, 300)


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
