"""Warm-up, measurement window and drain of a run (docs/SIMULATOR.md, "Steady
state"; AMPD.md section 6).

Arrivals start at t = 0 on an empty cluster and go on for the whole run. Only
sessions arriving inside the window ``[warmup_s, warmup_s + window_s)`` are
measured; the run ends when all of them have finished (arrivals keep coming
meanwhile, so the last of them see the same load as the first), or
``drain_s`` after the window at the latest. Defaults scale with the workload's
unloaded session lifetime ``L`` (``unloaded_lifetime_s``), every factor
[our choice]:

- warm-up ``WARMUP_LIFETIMES`` x L: a session's state (KV held, queue position)
  depends on the sessions that arrived during its life, so the cluster forgets
  its empty start after about one lifetime under load; two leave margin for
  lifetimes stretched by queueing.
- window ``max(WINDOW_LIFETIMES x L, MIN_WINDOW_SESSIONS / rate)``: at least ten
  lifetimes (five per half: ``verdict`` compares the first half with the whole),
  and enough sessions that the sampling noise of the half-vs-whole comparison
  stays well inside its 2-point tolerance (at 90 % attainment and 1,000 sessions
  per half, the difference has a standard deviation of 0.7 point).
- drain ``max(DRAIN_LIFETIMES x L, DRAIN_WINDOW_SHARE x window)``: a session that
  meets its SLO lives little longer than unloaded (TTFT within 5x an unloaded
  prefill, ITL within 1.5x a step), but near capacity a few sessions wait long
  for KV room or behind long prefills; a measured session still running that
  long after the window means the queues did not clear. A stable run ends as
  soon as its last measured session finishes, so a generous limit costs only
  the runs that hit it.
- overload stop: more than ``OVERLOAD_FACTOR`` x rate x L + ``OVERLOAD_MARGIN``
  sessions in the system at once means (Little's law) sessions live about five
  times their unloaded lifetime on average, while a session within its SLO lives
  little longer than unloaded (above). Growing or not, that cluster is
  overloaded: the run stops there (it would only spend time on a point no figure
  uses) and is unstable. The margin keeps the count's own fluctuation at light
  load (a handful of sessions in the system, some living far longer than the
  mean) from reading as overload.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ampd.core.errors import InputError
from ampd.core.session import Session
from ampd.perf.interface import PerfModel
from ampd.sim.limits import RunLimits

WARMUP_LIFETIMES = 2.0
WINDOW_LIFETIMES = 10.0
MIN_WINDOW_SESSIONS = 2000
DRAIN_LIFETIMES = 10.0
DRAIN_WINDOW_SHARE = 0.25
# [our choice] A run may hold this many sessions at most: about a gigabyte of session records
# (an hour of 256-GPU GAIA traffic at capacity is ~10^4 sessions).
MAX_RUN_SESSIONS = 1_000_000
OVERLOAD_FACTOR = 5.0
OVERLOAD_MARGIN = 50


def unloaded_lifetime_s(perf: PerfModel, sessions: Sequence[Session], tp: int) -> float:
    """Mean time from arrival to last token of ``sessions`` alone on an idle
    replica of ``tp`` GPUs: every round's prefill (``T_pre(l_hist, l_incr)``),
    its other output tokens one decode step of batch 1 each (at the round's mean
    context), and the tool latencies between rounds. Seconds.

    Raises:
        InputError: no sessions.
    """
    if not sessions:
        raise InputError("cannot compute a session lifetime from an empty workload")
    total_s = 0.0
    for s in sessions:
        for i, r in enumerate(s.rounds):
            hist = s.history_tokens(i)
            context = hist + r.input_tokens + r.output_tokens // 2
            total_s += perf.prefill_s(hist, r.input_tokens, tp)
            total_s += (r.output_tokens - 1) * perf.decode_step_s(1, context, tp)
        total_s += sum(r.tool_s for r in s.rounds[:-1])
    return total_s / len(sessions)


@dataclass(frozen=True)
class MeasurePlan:
    """A run's phases in simulated seconds (module docstring).

    Attributes:
        warmup_s: arrivals before the window, not measured.
        window_s: the measurement window; its first half is compared with the
            whole by ``verdict.judge``.
        drain_s: longest time after the window for measured sessions to finish.
        lifetime_s: the unloaded session lifetime the defaults came from.
    """

    warmup_s: float
    window_s: float
    drain_s: float
    lifetime_s: float

    @property
    def horizon_s(self) -> float:
        """Arrivals are needed up to here (the latest the run can stop)."""
        return self.warmup_s + self.window_s + self.drain_s

    @property
    def half_s(self) -> float:
        """End of the window's first half."""
        return self.warmup_s + self.window_s / 2

    def limits(self, rate_per_s: float) -> RunLimits:
        """The simulator's stop rules at ``rate_per_s``."""
        return RunLimits(self.warmup_s, self.warmup_s + self.window_s, self.horizon_s,
                         math.ceil(OVERLOAD_FACTOR * rate_per_s * self.lifetime_s) + OVERLOAD_MARGIN)


def measure_plan(lifetime_s: float, rate_per_s: float, warmup_s: float | None = None,
                 window_s: float | None = None, drain_s: float | None = None) -> MeasurePlan:
    """The phases of a run at ``rate_per_s`` (sessions/s) of a workload whose
    unloaded session lifetime is ``lifetime_s``; each phase not given takes its
    default (module docstring).

    Raises:
        InputError: a lifetime or rate that is not finite and > 0; a drain shorter
            than one lifetime (every run would end with measured sessions still
            running); a run that would hold more than ``MAX_RUN_SESSIONS`` sessions.
    """
    for name, value in (("session lifetime", lifetime_s), ("rate_per_s", rate_per_s)):
        if not (math.isfinite(value) and value > 0):
            raise InputError(f"{name}: must be a finite number > 0, got {value}")
    if drain_s is not None and drain_s < lifetime_s:
        raise InputError(f"measure.drain_s: {drain_s:g} s is shorter than one unloaded session lifetime "
                         f"({lifetime_s:.0f} s): the sessions arriving at the window's end could never finish")
    if window_s is None:
        window_s = max(WINDOW_LIFETIMES * lifetime_s, MIN_WINDOW_SESSIONS / rate_per_s)
    plan = MeasurePlan(
        warmup_s=warmup_s if warmup_s is not None else WARMUP_LIFETIMES * lifetime_s,
        window_s=window_s,
        drain_s=drain_s if drain_s is not None else max(DRAIN_LIFETIMES * lifetime_s, DRAIN_WINDOW_SHARE * window_s),
        lifetime_s=lifetime_s)
    expected = rate_per_s * plan.horizon_s
    if expected > MAX_RUN_SESSIONS:
        raise InputError(f"this run would hold {expected:.3g} sessions ({rate_per_s:g}/s over {plan.horizon_s:.3g} s "
                         f"of warm-up, window and drain), more than {MAX_RUN_SESSIONS:,}: lower workload.rate_per_s "
                         f"or measure.window_s / warmup_s / drain_s")
    return plan
