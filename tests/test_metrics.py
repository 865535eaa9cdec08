"""SLO attainment and summaries on records written by hand (AMPD.md section 1)."""

import math

import pytest

from ampd.metrics.records import RecordedItls, RoundRecord, SessionRecord
from ampd.metrics.slo import SloScope, attains, percentile, session_latencies, slo_attainment
from ampd.metrics.summary import summarize


def _session(sid, rounds, done=True):
    """rounds: list of (ready_s, first_token_s, itls, local)."""
    s = SessionRecord(sid, rounds[0][0], len(rounds))
    for i, (ready, first, itls, local) in enumerate(rounds):
        s.rounds.append(RoundRecord(sid, i, ready, 0, 10, len(itls) + 1, 0, first, first + sum(itls), local, 0, RecordedItls(itls)))
    s.done_s = s.rounds[-1].done_s if done else None
    return s


# Session A: TTFTs 0.5 and 1.5 (mean 1.0, max 1.5); ITLs 0.02 x 99 and 0.5 x 1:
#   mean ITL = (99 x 0.02 + 0.5) / 100 = 0.0248; P99 of 100 values = 0.02 + 0.99 x (0.5 - 0.02)... computed below.
A = _session("a", [(0.0, 0.5, [0.02] * 50, False), (10.0, 11.5, [0.02] * 49 + [0.5], True)])
# Session B: one round, TTFT 0.2, ITLs 0.1 x 4 -> mean ITL 0.1.
B = _session("b", [(1.0, 1.2, [0.1] * 4, False)])


def test_mean_scope_latencies():
    ttft, itl = session_latencies(A, SloScope.MEAN)
    assert ttft == pytest.approx(1.0)
    assert itl == pytest.approx((99 * 0.02 + 0.5) / 100)


def test_strict_scope_latencies():
    ttft, itl = session_latencies(A, SloScope.STRICT)
    assert ttft == pytest.approx(1.5)
    # 100 sorted ITLs: rank (100 - 1) x 0.99 = 98.01 -> 0.02 + 0.01 x (0.5 - 0.02)
    assert itl == pytest.approx(0.02 + 0.01 * 0.48)


def test_attainment_by_scope():
    assert attains(A, 1.0, 0.03, SloScope.MEAN)
    assert not attains(A, 1.0, 0.03, SloScope.STRICT)  # max TTFT 1.5 > 1.0
    assert not attains(B, 1.0, 0.05, SloScope.MEAN)  # ITL 0.1 > 0.05
    assert slo_attainment([A, B], 1.0, 0.2) == 1.0
    assert slo_attainment([A, B], 1.0, 0.05) == 0.5


def test_incomplete_session_never_attains():
    c = _session("c", [(0.0, 0.1, [0.01], False)], done=False)
    assert not attains(c, 10.0, 10.0, SloScope.MEAN)


def test_percentile_matches_linear_interpolation():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert math.isnan(percentile([], 50))


def test_summary_counts_local_share_and_goodput():
    s = summarize([A, B], 1.0, 0.2)
    assert s.num_sessions == 2 and s.num_rounds == 3
    assert s.local_prefill_share == pytest.approx(1 / 3)
    assert s.slo_attainment == 1.0
    # span: first arrival 0.0 to last completion 11.5 + 49 x 0.02 + 0.5 = 12.98
    assert s.goodput_sessions_per_s == pytest.approx(2 / 12.98)
    assert s.ttft_p50_s == pytest.approx(0.5)


def test_same_placement_share_counts_rounds_placed_alike_and_missing_ones_as_different():
    from ampd.metrics.records import RecordedItls, RoundRecord, SessionRecord
    from ampd.metrics.summary import same_placement_share

    def run(*locals_):
        record = SessionRecord("s", 0.0, len(locals_))
        record.rounds = [RoundRecord("s", i, 0.0, 0, 1, 1, 0, local=x) for i, x in enumerate(locals_)]
        return [record]
    assert same_placement_share(run(True, False, True, False), run(True, True, True)) == 0.5  # 2 of 4 alike
    assert same_placement_share(run(True, False), run(True, False)) == 1.0
