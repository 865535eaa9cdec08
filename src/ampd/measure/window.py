"""The figures of a run from its session records: those arriving in the
measurement window summarised, the verdict judged (any runtime: the simulator,
or ``ampd replay`` against a live cluster)."""

from __future__ import annotations

from collections.abc import Sequence

from ampd.measure.plan import MeasurePlan
from ampd.measure.verdict import MIN_VERDICT_LIFETIMES, MIN_VERDICT_SESSIONS, TRANSIENT, Stability, judge
from ampd.metrics.records import SessionRecord
from ampd.metrics.slo import SloScope, slo_attainment
from ampd.metrics.summary import RunSummary, summarize


def measure_window(records: Sequence[SessionRecord], plan: MeasurePlan, ttft_slo_s: float, itl_slo_s: float,
                   scope: SloScope, stopped: str | None = None) -> tuple[RunSummary, Stability]:
    """The summary of the sessions that arrived in ``plan``'s window, and the
    stability verdict (``verdict.judge``); ``stopped`` says why the run ended
    before its measured sessions all finished (None: they did)."""
    start_s, end_s = plan.warmup_s, plan.warmup_s + plan.window_s
    measured = [r for r in records if start_s <= r.arrival_s < end_s]
    first_half = [r for r in measured if r.arrival_s < plan.half_s]
    summary = summarize(measured, ttft_slo_s, itl_slo_s, scope, duration_s=plan.window_s)
    half = slo_attainment(first_half, ttft_slo_s, itl_slo_s, scope)
    lifetimes = plan.window_s / plan.lifetime_s
    if stopped is None and (len(measured) < MIN_VERDICT_SESSIONS or lifetimes < MIN_VERDICT_LIFETIMES):
        reason = (f"window too short for a steady-state verdict: {len(measured)} session(s) over "
                  f"{lifetimes:.1f} unloaded lifetimes (needs >= {MIN_VERDICT_SESSIONS} and >= "
                  f"{MIN_VERDICT_LIFETIMES:g}; the default window has both)")
        return summary, Stability(TRANSIENT, reason, half)
    lives = [(r.arrival_s, r.done_s - r.arrival_s, plan.unloaded.record_s(r)) for r in measured if r.complete]
    return summary, judge(summary.slo_attainment, half, lives, start_s, end_s, stopped)
