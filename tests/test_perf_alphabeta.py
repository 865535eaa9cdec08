"""Piecewise alpha-beta functions: exact recovery of known coefficients, evaluation at
breakpoints, refusal of impossible coefficients."""

import pytest

from ampd.core.errors import InputError
from ampd.perf.alphabeta import (DecodeCost, ImpossibleFitError, PrefillCost, Segments, fit_decode,
                                 fit_prefill)

# A known T_pre, continuous at 100 and with a step of 2 ms at 1000 (written out by hand):
#   new <= 100:         0.010  + 1.0e-5 new
#   100 < new <= 1000:  0.0095 + 1.5e-5 new   (0.011 at 100, both sides)
#   new > 1000:         0.0015 + 2.5e-5 new   (0.0245 left of 1000, 0.0265 right of it)
# plus 1e-9 per attended pair and 1e-7 per history token.
BREAKS = (100, 1000)
ALPHA = (0.010, 0.0095, 0.0015)
BETA = (1.0e-5, 1.5e-5, 2.5e-5)


def _true_prefill_s(hist, new):
    k = 0 if new <= 100 else 1 if new <= 1000 else 2
    return ALPHA[k] + BETA[k] * new + 1e-9 * new * (hist + new / 2) + 1e-7 * hist


def test_prefill_fit_recovers_known_coefficients():
    samples = [(h, n, _true_prefill_s(h, n)) for h in (0, 300, 5000) for n in (1, 50, 100, 101, 400, 1000, 1001, 3000)]
    cost = fit_prefill(samples, BREAKS)
    assert cost.segments.breakpoints == BREAKS
    assert cost.segments.alpha_s == pytest.approx(ALPHA, rel=1e-8)
    assert cost.segments.beta_s == pytest.approx(BETA, rel=1e-8)
    assert cost.gamma_s_per_pair == pytest.approx(1e-9, rel=1e-8)
    assert cost.delta_s_per_hist_token == pytest.approx(1e-7, rel=1e-8)


def test_decode_fit_recovers_known_coefficients():
    # b <= 8: 0.02 + 1e-4 b; b > 8: 0.0196 + 1.5e-4 b (continuous: 0.0208 at 8); 2e-8 per context token.
    def true_s(b, ctx):
        return (0.02 + 1e-4 * b if b <= 8 else 0.0196 + 1.5e-4 * b) + 2e-8 * ctx
    samples = [(b, b * c, true_s(b, b * c)) for b in (1, 4, 8, 9, 64, 256) for c in (100, 4000)]
    cost = fit_decode(samples, (8,))
    assert cost.segments.alpha_s == pytest.approx((0.02, 0.0196), rel=1e-8)
    assert cost.segments.beta_s == pytest.approx((1e-4, 1.5e-4), rel=1e-8)
    assert cost.gamma_s_per_context_token == pytest.approx(2e-8, rel=1e-8)


def test_breakpoint_belongs_to_the_segment_on_its_left():
    cost = PrefillCost(Segments(BREAKS, ALPHA, BETA), 0.0, 0.0)
    assert cost(0, 1000) == pytest.approx(0.0245)
    assert cost(0, 1001) == pytest.approx(0.0015 + 2.5e-5 * 1001)
    assert DecodeCost(Segments((8,), (0.02, 0.0196), (1e-4, 1.5e-4)), 0.0)(8, 0) == pytest.approx(0.0208)


def test_fit_of_decreasing_samples_still_never_decreases():
    samples = [(0, n, 1.0 / n) for n in range(1, 400, 7)]
    cost = fit_prefill(samples, (100,))
    times = [cost(0, n) for n in range(1, 400)]
    assert all(b >= a for a, b in zip(times, times[1:]))


def test_negative_coefficients_are_refused():
    with pytest.raises(ImpossibleFitError, match="negative"):
        Segments((), (-0.01,), (1e-4,))  # negative time at size 0
    with pytest.raises(ImpossibleFitError):
        Segments((), (0.01,), (-1e-4,))  # negative slope
    with pytest.raises(ImpossibleFitError):
        PrefillCost(Segments((), (0.01,), (1e-4,)), -1e-9, 0.0)
    with pytest.raises(ImpossibleFitError):
        DecodeCost(Segments((), (0.01,), (1e-4,)), float("nan"))


def test_drop_at_a_breakpoint_is_refused():
    # 0.02 left of 100, 0.011 right of it.
    with pytest.raises(ImpossibleFitError, match="breakpoint 100"):
        Segments((100,), (0.01, 0.001), (1e-4, 1e-4))


def test_bad_samples_and_shapes_are_input_errors():
    with pytest.raises(InputError):
        fit_prefill([(0, 10, 0.0), (0, 20, 0.1)], ())
    with pytest.raises(InputError, match="segment 1"):
        fit_decode([(1, 0, 0.1), (2, 0, 0.2)], (8,))
    with pytest.raises(InputError):
        Segments((10, 10), (0.0, 0.0, 0.0), (0.0, 0.0, 0.0))
