"""Arrival processes and rate changes."""

import numpy as np
import pytest

from ampd.core.errors import InputError
from ampd.core.session import Round, Session
from ampd.workload import arrival_rate_per_s, poisson_arrivals, rescale_rate, take, with_poisson_arrivals


def _sessions(arrivals_s):
    return [Session(f"s{i}", t, (Round(10, 5, 1.0), Round(3, 2))) for i, t in enumerate(arrivals_s)]


def test_poisson_gaps_have_mean_one_over_rate():
    arrivals_s = poisson_arrivals(20000, 4.0, np.random.default_rng(0))
    gaps_s = np.diff([0.0] + arrivals_s)
    assert arrivals_s[0] > 0.0
    assert np.all(gaps_s > 0.0)
    assert gaps_s.mean() == pytest.approx(1 / 4.0, rel=0.03)


def test_poisson_is_reproducible_from_the_generator():
    assert poisson_arrivals(5, 1.0, np.random.default_rng(3)) == poisson_arrivals(5, 1.0, np.random.default_rng(3))
    assert poisson_arrivals(5, 1.0, np.random.default_rng(3)) != poisson_arrivals(5, 1.0, np.random.default_rng(4))


def test_with_poisson_arrivals_keeps_order_and_rounds():
    sessions = _sessions([0.0, 0.0, 0.0])
    new = with_poisson_arrivals(sessions, 2.0, np.random.default_rng(1))
    assert [s.session_id for s in new] == ["s0", "s1", "s2"]
    assert [s.rounds for s in new] == [s.rounds for s in sessions]
    assert [s.arrival_s for s in new] == poisson_arrivals(3, 2.0, np.random.default_rng(1))


def test_rescale_rate_doubles_the_rate():
    sessions = _sessions([1.0, 2.0, 4.0])
    faster = rescale_rate(sessions, 2.0)
    assert [s.arrival_s for s in faster] == [0.5, 1.0, 2.0]
    assert [s.rounds for s in faster] == [s.rounds for s in sessions]
    # (n - 1) / span: 2 gaps over 3 s, then over 1.5 s.
    assert arrival_rate_per_s(sessions) == pytest.approx(2 / 3)
    assert arrival_rate_per_s(faster) == pytest.approx(4 / 3)


def test_take():
    sessions = _sessions([0.0, 1.0, 2.0])
    assert take(sessions, 2) == sessions[:2]
    with pytest.raises(InputError):
        take(sessions, 4)


@pytest.mark.parametrize("call", [
    lambda: poisson_arrivals(3, 0.0, np.random.default_rng(0)),
    lambda: poisson_arrivals(-1, 1.0, np.random.default_rng(0)),
    lambda: rescale_rate(_sessions([1.0]), float("nan")),
    lambda: arrival_rate_per_s(_sessions([0.0])),
    lambda: arrival_rate_per_s(_sessions([3.0, 3.0])),
])
def test_bad_arguments_raise_input_error(call):
    with pytest.raises(InputError):
        call()
