"""Per-session SLO attainment (AMPD.md section 1)."""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence

import numpy as np

from ampd.metrics.records import SessionRecord


class SloScope(str, enum.Enum):
    """How a session's latencies are compared with the thresholds.

    ``mean`` (default, [our choice] in AMPD.md section 1): the mean TTFT over its
    rounds and the mean ITL over all its tokens. ``strict``: every round's TTFT
    within the threshold and the P99 of its ITLs within the threshold.
    """

    MEAN = "mean"
    STRICT = "strict"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), linear interpolation between closest ranks;
    NaN for no values."""
    return float(np.percentile(values, q)) if len(values) else math.nan


def session_latencies(record: SessionRecord, scope: SloScope) -> tuple[float, float]:
    """(TTFT, ITL) of a complete session under ``scope``, seconds. A session
    whose rounds produced one token each has ITL 0.

    Raises:
        ValueError: the session is not complete.
    """
    if not record.complete:
        raise ValueError(f"session {record.session_id} is not complete")
    ttfts = [r.ttft_s for r in record.rounds]
    num_itls = record.itl_count
    if scope is SloScope.STRICT:
        return max(ttfts), (percentile(record.itl_values(), 99) if num_itls else 0.0)
    return sum(ttfts) / len(ttfts), (sum(r.itls_s.sum_s for r in record.rounds) / num_itls if num_itls else 0.0)


def attains(record: SessionRecord, ttft_slo_s: float, itl_slo_s: float, scope: SloScope) -> bool:
    """Whether a session met both thresholds; an incomplete session never does."""
    if not record.complete:
        return False
    ttft_s, itl_s = session_latencies(record, scope)
    return ttft_s <= ttft_slo_s and itl_s <= itl_slo_s


def slo_attainment(records: Sequence[SessionRecord], ttft_slo_s: float, itl_slo_s: float,
                   scope: SloScope = SloScope.MEAN) -> float:
    """Fraction of sessions that attain their SLO (the headline metric); NaN for none."""
    if not records:
        return math.nan
    return sum(attains(r, ttft_slo_s, itl_slo_s, scope) for r in records) / len(records)
