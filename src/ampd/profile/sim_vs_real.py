"""Simulated against served: the figures that say whether the simulator, driven by a
profile, predicts a real cluster (``ampd validate``, bench/bench_sim_vs_real.py).

Rounds are matched by ``(session_id, round_index)`` among those both sides finished.
The headline errors are of means (a figure a user plans with: mean TTFT, mean ITL):
``|mean(real) - mean(sim)| / mean(real)``; per-round errors are reported too (median of
``|real - sim| / real``), since two means can agree while single rounds do not.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from ampd.metrics.records import RoundRecord, SessionRecord
from ampd.metrics.summary import RunSummary, same_placement_share


def _finished(sessions: Sequence[SessionRecord]) -> dict[tuple[str, int], RoundRecord]:
    return {(r.session_id, r.round_index): r for s in sessions for r in s.rounds
            if r.first_token_s is not None and r.done_s is not None}


def _mean_itl_s(r: RoundRecord) -> float | None:
    return r.itls_s.sum_s / len(r.itls_s) if len(r.itls_s) else None


def _rel(real: float, sim: float) -> float:
    return abs(real - sim) / real if real > 0 else float("nan")


def compare(real: Sequence[SessionRecord], sim: Sequence[SessionRecord], real_summary: RunSummary,
            sim_summary: RunSummary) -> dict[str, float | int]:
    """The sim-vs-real figures of one served run against the simulated one.

    Args:
        real, sim: the sessions each side ran (the same trace).
        real_summary, sim_summary: each side's summary over the same sessions and
            thresholds.

    Returns:
        ``ttft_mean_rel_error``, ``itl_mean_rel_error`` (fractions),
        ``ttft_round_median_rel_error``, ``itl_round_median_rel_error``,
        ``attainment_delta`` (real minus simulated, in points of 100),
        ``local_share_real`` and ``_sim``, ``placement_agreement`` (share of the real
        run's rounds the simulator placed alike), ``num_sessions`` and ``num_rounds``
        matched, and the four means (seconds).
    """
    real_rounds, sim_rounds = _finished(real), _finished(sim)
    keys = sorted(real_rounds.keys() & sim_rounds.keys())
    pairs = [(real_rounds[k], sim_rounds[k]) for k in keys]
    ttft = [(a.ttft_s, b.ttft_s) for a, b in pairs]
    itl = [(x, y) for x, y in ((_mean_itl_s(a), _mean_itl_s(b)) for a, b in pairs) if x and y]
    real_ttft, sim_ttft = statistics.fmean(t[0] for t in ttft), statistics.fmean(t[1] for t in ttft)
    real_itl, sim_itl = statistics.fmean(t[0] for t in itl), statistics.fmean(t[1] for t in itl)
    matched = {k[0] for k in keys}
    return {
        "ttft_mean_rel_error": _rel(real_ttft, sim_ttft),
        "itl_mean_rel_error": _rel(real_itl, sim_itl),
        "ttft_round_median_rel_error": statistics.median(_rel(a, b) for a, b in ttft),
        "itl_round_median_rel_error": statistics.median(_rel(a, b) for a, b in itl),
        "attainment_delta": 100 * (real_summary.slo_attainment - sim_summary.slo_attainment),
        "local_share_real": real_summary.local_prefill_share, "local_share_sim": sim_summary.local_prefill_share,
        "placement_agreement": same_placement_share([s for s in real if s.session_id in matched],
                                                    [s for s in sim if s.session_id in matched]),
        "real_ttft_mean_s": real_ttft, "sim_ttft_mean_s": sim_ttft,
        "real_itl_mean_s": real_itl, "sim_itl_mean_s": sim_itl,
        "num_sessions": len(matched), "num_rounds": len(keys),
    }
