"""Warm-up, measurement window and drain of a run (docs/SIMULATOR.md, "Steady
state"; AMPD.md section 6).

Arrivals start at t = 0 on an empty cluster and go on for the whole run. Only
sessions arriving inside the window ``[warmup_s, warmup_s + window_s)`` are
measured; the run ends when all of them have finished (arrivals keep coming
meanwhile, so the last of them see the same load as the first), or
``drain_s`` after the window at the latest. Defaults scale with two lifetimes
of the workload's sessions, every factor [our choice]:

- ``L``, the *unloaded* lifetime (``UnloadedLifetimes``): alone on an idle
  replica; what a session's slowdown is measured against (``verdict``).
- ``S``, the *SLO* lifetime (``slo_lifetime_s``): the longest a session that
  keeps its SLO can live, every TTFT and ITL at its threshold (2-3.2 L in the
  paper's twelve cells). Near capacity, where a figure matters, nearly every
  session keeps its SLO, so sessions live at most about ``S`` on average.

- warm-up ``WARMUP_SLO_LIFETIMES`` x S: a session's state (KV held, queue
  position) depends on the sessions that arrived during its life, so the
  cluster forgets its empty start after about one lifetime *under load*; two
  SLO lifetimes are at least two loaded ones near capacity, and leave margin
  for the long tail (were lifetimes exponential, e^-2 = 14 % of the population
  would still be missing after two mean lifetimes, e^-1 = 37 % after one).
  Sized by ``L`` (two of them, until 2026-12), GAIA's warm-up held 1.2 loaded
  lifetimes (sessions lived 1.6-1.7 L near capacity,
  ``bench/results/backlog_growth.json``) and the population was still filling
  through the window.
- window ``max(WINDOW_LIFETIMES x L, MIN_WINDOW_SESSIONS / rate)``: at least ten
  lifetimes (five per half: ``verdict`` compares the first half with the whole),
  and enough sessions that the sampling noise of the half-vs-whole comparison
  stays well inside its 2-point tolerance (at 90 % attainment and 1,000 sessions
  per half, the difference has a standard deviation of 0.7 point).
- drain ``max(DRAIN_LIFETIMES x L, DRAIN_WINDOW_SHARE x window)``: a session that
  meets its SLO lives at most ``S`` (a few ``L``), but near capacity a few
  sessions wait long for KV room or behind long prefills; a measured session
  still running that long after the window means the queues did not clear. A
  stable run ends as soon as its last measured session finishes, so a generous
  limit costs only the runs that hit it.
- overload stop: more than ``OVERLOAD_FACTOR`` x rate x L + ``OVERLOAD_MARGIN``
  sessions in the system at once means (Little's law) sessions live about five
  times their unloaded lifetime on average, beyond the 2-3.2 L a session within
  its SLO can live. Growing or not, that cluster is overloaded: the run stops
  there (it would only spend time on a point no figure uses) and is unstable.
  The margin keeps the count's own fluctuation at light load (a handful of
  sessions in the system, some living far longer than the mean) from reading as
  overload.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ampd.core.errors import InputError
from ampd.core.session import Session
from ampd.metrics.records import SessionRecord
from ampd.perf.interface import PerfModel
from ampd.core.limits import RunLimits

WARMUP_SLO_LIFETIMES = 2.0
WINDOW_LIFETIMES = 10.0
MIN_WINDOW_SESSIONS = 2000
DRAIN_LIFETIMES = 10.0
DRAIN_WINDOW_SHARE = 0.25
# [our choice] A run may hold this many sessions at most: about a gigabyte of session records
# (an hour of 256-GPU GAIA traffic at capacity is ~10^4 sessions).
MAX_RUN_SESSIONS = 1_000_000
OVERLOAD_FACTOR = 5.0
OVERLOAD_MARGIN = 50


@dataclass(frozen=True)
class UnloadedLifetimes:
    """How long a session lives alone on an idle replica of ``tp`` GPUs: every
    round's serving path (a local round's, ``perf.round_paths_s``) and
    prefill (``T_pre(l_hist, l_incr)``), its other output tokens one decode step
    of batch 1 each (at the round's mean context), and the tool calls between
    rounds. Seconds.

    Attributes:
        perf: the cost model.
        tp: the replica's TP degree (the SLO rule's reference, ``reference_tp``).
    """

    perf: PerfModel
    tp: int

    def round_s(self, hist_tokens: int, new_tokens: int, output_tokens: int) -> float:
        """One round's prefill and decode, and its serving path (a local round's,
        ``perf.round_paths_s``), seconds."""
        context = hist_tokens + new_tokens + output_tokens // 2
        return (self.perf.round_paths_s(None, self.tp).before_s + self.perf.prefill_s(hist_tokens, new_tokens, self.tp)
                + (output_tokens - 1) * self.perf.decode_step_s(1, context, self.tp))

    def session_s(self, session: Session) -> float:
        """A workload session's unloaded lifetime, seconds."""
        work_s = sum(self.round_s(session.history_tokens(i), r.input_tokens, r.output_tokens)
                     for i, r in enumerate(session.rounds))
        return work_s + sum(r.tool_s for r in session.rounds[:-1])

    def record_s(self, record: SessionRecord) -> float:
        """A finished session's unloaded lifetime from its record, seconds: its
        rounds' sizes (history recomputed after an eviction counted as history:
        unloaded, nothing is evicted) and the tool calls as they happened (from
        one round's end to the next one's input)."""
        rounds = record.rounds
        work_s = sum(self.round_s(r.hist_tokens + r.recomputed_tokens, r.new_tokens - r.recomputed_tokens,
                                  r.output_tokens) for r in rounds)
        return work_s + sum(b.ready_s - a.done_s for a, b in zip(rounds, rounds[1:]))

    def mean_s(self, sessions: Sequence[Session]) -> float:
        """The mean over ``sessions``, seconds.

        Raises:
            InputError: no sessions.
        """
        if not sessions:
            raise InputError("cannot compute a session lifetime from an empty workload")
        return sum(self.session_s(s) for s in sessions) / len(sessions)


def slo_lifetime_s(sessions: Sequence[Session], ttft_slo_s: float, itl_slo_s: float) -> float:
    """The mean over ``sessions`` of the longest a session keeping its SLO lives:
    every round's first token at the TTFT threshold, its other tokens at the ITL
    threshold, and the tool calls between rounds. Seconds.

    Raises:
        InputError: no sessions.
    """
    if not sessions:
        raise InputError("cannot compute a session lifetime from an empty workload")
    total_s = 0.0
    for s in sessions:
        total_s += sum(ttft_slo_s + (r.output_tokens - 1) * itl_slo_s for r in s.rounds)
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
        lifetime_s: the workload's mean unloaded session lifetime ``L``.
        slo_lifetime_s: the workload's mean SLO lifetime ``S``.
        unloaded: each session's unloaded lifetime, which ``verdict`` measures
            its slowdown against.
    """

    warmup_s: float
    window_s: float
    drain_s: float
    lifetime_s: float
    slo_lifetime_s: float
    unloaded: UnloadedLifetimes

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


def measure_plan(unloaded: UnloadedLifetimes, lifetime_s: float, slo_lifetime_s: float, rate_per_s: float,
                 warmup_s: float | None = None, window_s: float | None = None,
                 drain_s: float | None = None) -> MeasurePlan:
    """The phases of a run at ``rate_per_s`` (sessions/s) of a workload whose
    mean unloaded session lifetime is ``lifetime_s`` (``unloaded.mean_s``) and
    mean SLO lifetime ``slo_lifetime_s`` (``slo_lifetime_s``); each phase not
    given takes its default (module docstring).

    Raises:
        InputError: a lifetime or rate that is not finite and > 0; a drain shorter
            than one lifetime (every run would end with measured sessions still
            running); a run that would hold more than ``MAX_RUN_SESSIONS`` sessions.
    """
    for name, value in (("session lifetime", lifetime_s), ("SLO session lifetime", slo_lifetime_s),
                        ("rate_per_s", rate_per_s)):
        if not (math.isfinite(value) and value > 0):
            raise InputError(f"{name}: must be a finite number > 0, got {value}")
    if drain_s is not None and drain_s < lifetime_s:
        raise InputError(f"measure.drain_s: {drain_s:g} s is shorter than one unloaded session lifetime "
                         f"({lifetime_s:.0f} s): the sessions arriving at the window's end could never finish")
    if window_s is None:
        window_s = max(WINDOW_LIFETIMES * lifetime_s, MIN_WINDOW_SESSIONS / rate_per_s)
    plan = MeasurePlan(
        warmup_s=warmup_s if warmup_s is not None else WARMUP_SLO_LIFETIMES * slo_lifetime_s,
        window_s=window_s,
        drain_s=drain_s if drain_s is not None else max(DRAIN_LIFETIMES * lifetime_s, DRAIN_WINDOW_SHARE * window_s),
        lifetime_s=lifetime_s, slo_lifetime_s=slo_lifetime_s, unloaded=unloaded)
    expected = rate_per_s * plan.horizon_s
    if expected > MAX_RUN_SESSIONS:
        raise InputError(f"this run would hold {expected:.3g} sessions ({rate_per_s:g}/s over {plan.horizon_s:.3g} s "
                         f"of warm-up, window and drain), more than {MAX_RUN_SESSIONS:,}: lower workload.rate_per_s "
                         f"or measure.window_s / warmup_s / drain_s")
    return plan
