"""Summary of a run: attainment, latency percentiles, local share, goodput."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ampd.metrics.records import SessionRecord
from ampd.metrics.slo import SloScope, attains, percentile


@dataclass(frozen=True)
class RunSummary:
    """Headline figures of one run (times in seconds).

    Attributes:
        slo_attainment: fraction of sessions within both thresholds.
        scope: the SLO scope used.
        num_sessions, num_complete, num_rounds: counts.
        ttft_p50_s, ttft_p95_s, ttft_p99_s: per-round TTFT percentiles.
        itl_p50_s, itl_p95_s, itl_p99_s: per-token ITL percentiles.
        ttft_mean_s, itl_mean_s: means over rounds and over tokens.
        local_prefill_share: fraction of prefills run on the bound decode worker.
        goodput_sessions_per_s: sessions that attained their SLO per second: of
            the measurement window when given, else of the run (first arrival to
            last completion).
    """

    slo_attainment: float
    scope: str
    num_sessions: int
    num_complete: int
    num_rounds: int
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p95_s: float
    ttft_p99_s: float
    itl_mean_s: float
    itl_p50_s: float
    itl_p95_s: float
    itl_p99_s: float
    local_prefill_share: float
    goodput_sessions_per_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summarize(records: list[SessionRecord], ttft_slo_s: float, itl_slo_s: float,
              scope: SloScope = SloScope.MEAN, duration_s: float | None = None) -> RunSummary:
    """Summarise ``records`` under the given thresholds and scope; ``duration_s``
    is the window they arrived in (for the goodput)."""
    rounds = [r for s in records for r in s.rounds if r.first_token_s is not None]
    ttfts = [r.ttft_s for r in rounds]
    parts = [r.itls_s.values() for r in rounds if len(r.itls_s)]
    itls = np.concatenate(parts) if parts else np.empty(0)
    good = sum(attains(s, ttft_slo_s, itl_slo_s, scope) for s in records)
    complete = [s for s in records if s.complete]
    if duration_s is not None:
        span_s = duration_s
    else:
        span_s = (max(s.done_s for s in complete) - min(s.arrival_s for s in records)) if complete else 0.0
    return RunSummary(
        slo_attainment=good / len(records) if records else float("nan"),
        scope=scope.value,
        num_sessions=len(records),
        num_complete=len(complete),
        num_rounds=len(rounds),
        ttft_mean_s=_mean(ttfts),
        ttft_p50_s=percentile(ttfts, 50), ttft_p95_s=percentile(ttfts, 95), ttft_p99_s=percentile(ttfts, 99),
        itl_mean_s=sum(r.itls_s.sum_s for r in rounds) / len(itls) if len(itls) else float("nan"),
        itl_p50_s=percentile(itls, 50), itl_p95_s=percentile(itls, 95), itl_p99_s=percentile(itls, 99),
        local_prefill_share=_mean([1.0 if r.local else 0.0 for r in rounds]),
        goodput_sessions_per_s=good / span_s if span_s > 0 else float("nan"),
    )


def same_placement_share(reference: list[SessionRecord], other: list[SessionRecord]) -> float:
    """Fraction of ``reference``'s rounds that ``other`` placed alike (prefill
    local or remote): how two runtimes' routing decisions agree on one trace. A
    round ``other`` lacks counts as placed differently."""
    placed = {(r.session_id, r.round_index): r.local for s in other for r in s.rounds}
    rounds = [r for s in reference for r in s.rounds]
    return sum(placed.get((r.session_id, r.round_index)) == r.local for r in rounds) / len(rounds)
