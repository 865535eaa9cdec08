"""Whether a run measured a steady state (AMPD.md section 6).

A point is **stable** when (1) the attainment of the sessions arriving in the
first half of the window is within ``ATTAINMENT_TOLERANCE`` of the whole
window's, i.e. measuring over T and over 2T agree; (2) the sessions in the
system did not keep growing through the window; (3) the run neither hit its
overload stop nor its drain limit. Otherwise it is **unstable (overloaded)** and
its attainment is not a figure of the rate: it only says how far the queues had
grown when the run stopped. A run of a fixed number of sessions, or a window
too short to tell (fewer than ``MIN_VERDICT_SESSIONS`` sessions or
``MIN_VERDICT_LIFETIMES`` unloaded lifetimes), is a **transient** and is never
judged stable (a run stopped for overload is unstable whatever its window).

Growth [our choice]: the mean number of sessions in the system (sampled at
every arrival, which sees time averages for Poisson arrivals) over the window's
last quarter minus that over its first quarter, as a fraction of the window's
mean. It counts as growing above ``GROWTH_TOLERANCE`` (20 %) and above
``GROWTH_NOISE_SD`` standard deviations of a Poisson count (the in-system count
of a stable multi-server system is roughly Poisson, sd = sqrt(mean)), so small
clusters' fluctuations are not called growth. An overloaded cluster's backlog
grows linearly: at 2 % over its capacity the count grows ~15 % between the
quarters of a ten-lifetime window, and the attainment check catches the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

STABLE, UNSTABLE, TRANSIENT = "stable", "unstable", "transient"
ATTAINMENT_TOLERANCE = 0.02  # AMPD.md section 6: "doubling the window moves it by <= 2 points"
# [our choice] The least a window must hold for a verdict: at 90 % attainment the first half
# differs from the whole by sqrt(0.09 / n) in standard deviation, 0.95 point at 1,000 sessions
# (2.1 sd inside the tolerance; the default window's 2,000 give 3 sd). Five lifetimes: the
# window's halves must each outlast a session's life for its state to turn over.
MIN_VERDICT_SESSIONS = 1000
MIN_VERDICT_LIFETIMES = 5.0
GROWTH_TOLERANCE = 0.2
GROWTH_NOISE_SD = 3.0


@dataclass(frozen=True)
class Stability:
    """The verdict on one run.

    Attributes:
        verdict: ``stable``, ``unstable`` or ``transient``.
        reason: why it is not stable ("" when it is).
        attainment_half: SLO attainment of the window's first half (NaN for a transient).
        backlog_growth: growth of the sessions in the system over the window, as a
            fraction of their mean (NaN for a transient).
    """

    verdict: str
    reason: str = ""
    attainment_half: float = math.nan
    backlog_growth: float = math.nan

    @property
    def stable(self) -> bool:
        return self.verdict == STABLE

    def to_dict(self) -> dict:
        return asdict(self)


def backlog_growth(samples: Sequence[tuple[float, int]], start_s: float, end_s: float) -> tuple[float, float]:
    """(growth as a fraction of the mean, growth in Poisson standard deviations) of
    the sessions in the system between the first and last quarter of
    ``[start_s, end_s)``; ``samples`` are (time s, sessions in the system). (0, 0)
    when a quarter has no sample."""
    quarter_s = (end_s - start_s) / 4
    first = [n for t, n in samples if start_s <= t < start_s + quarter_s]
    last = [n for t, n in samples if end_s - quarter_s <= t < end_s]
    window = [n for t, n in samples if start_s <= t < end_s]
    if not first or not last:
        return 0.0, 0.0
    mean = max(1.0, sum(window) / len(window))
    delta = sum(last) / len(last) - sum(first) / len(first)
    return delta / mean, delta / math.sqrt(mean)


def judge(attainment: float, attainment_half: float, samples: Sequence[tuple[float, int]],
          start_s: float, end_s: float, stopped: str | None) -> Stability:
    """The verdict on a window run (module docstring).

    Args:
        attainment, attainment_half: over the whole window and its first half.
        samples: (time s, sessions in the system), at every arrival.
        start_s, end_s: the window.
        stopped: why the simulation stopped early, or None when every measured
            session finished.
    """
    growth, growth_sd = backlog_growth(samples, start_s, end_s)
    reasons = []
    if stopped is not None:
        reasons.append(stopped)
    if not abs(attainment - attainment_half) <= ATTAINMENT_TOLERANCE + 1e-12:  # 2.0 points is within; NaN is not
        reasons.append(f"attainment {100 * attainment_half:.1f} % over the window's first half, "
                       f"{100 * attainment:.1f} % over all of it")
    if growth > GROWTH_TOLERANCE and growth_sd > GROWTH_NOISE_SD:
        reasons.append(f"sessions in the system grew {100 * growth:.0f} % through the window")
    return Stability(UNSTABLE if reasons else STABLE, "; ".join(reasons), attainment_half, growth)
