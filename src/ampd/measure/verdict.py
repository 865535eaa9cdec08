"""Whether a run measured a steady state (AMPD.md section 6).

A point is **stable** when (1) the attainment of the sessions arriving in the
first half of the window is within ``ATTAINMENT_TOLERANCE`` of the whole
window's, i.e. measuring over T and over 2T agree; (2) the sessions' slowdown
did not keep growing through the window; (3) the run neither hit its
overload stop nor its drain limit. Otherwise it is **unstable (overloaded)** and
its attainment is not a figure of the rate: it only says how far the queues had
grown when the run stopped. A run of a fixed number of sessions, or a window
too short to tell (fewer than ``MIN_VERDICT_SESSIONS`` sessions or
``MIN_VERDICT_LIFETIMES`` unloaded lifetimes), is a **transient** and is never
judged stable (a run stopped for overload is unstable whatever its window).

Growth [our choice]: the *slowdown* of the sessions arriving in the window's
last quarter against those arriving in its first: a quarter's slowdown is its
sessions' lifetimes summed over their unloaded lifetimes summed
(``plan.UnloadedLifetimes``), the growth the difference as a fraction of the
whole window's slowdown. It counts as growing above ``GROWTH_TOLERANCE`` (20 %)
and above ``GROWTH_NOISE_SD`` standard errors of the difference (each quarter's
ratio estimate has variance sum((y - R x)^2) / (n (n - 1) mean(x)^2), y the
lifetimes, x the unloaded ones), so small samples' fluctuations are not called
growth. An overloaded cluster's backlog grows linearly and every session waits
longer than the one before, so the slowdown grows as the count does (Little's
law); where it grows less (the tail of a still-running quarter is not counted:
that run hit its drain limit and is unstable anyway), the attainment check
catches the rest (Mixtral-8x7B / GAIA a third over capacity: slowdown +6 %, but
attainment 50.9 % over the first half against 31.2 % over the whole).

Why slowdown and not the number of sessions in the system (the measure until
2026-12): the count follows what the sessions hold (a quarter whose sessions
have more rounds holds more of them at once, overloaded or not), and with a
long-tailed lifetime it keeps filling for several mean lifetimes after an empty
start. On Mixtral-8x7B / GAIA the count grew 19-33 % on plans holding 92-98 %
attainment with matching halves (``bench/results/backlog_growth.json``).
Normalised by each session's own unloaded lifetime, a session's size cancels,
and a session's lifetime depends on the load during its life, not on how many
long sessions arrived before the run began.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

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
        slowdown_growth: growth of the sessions' slowdown over the window, as a
            fraction of the window's (NaN for a transient).
        slowdown: the window's sessions' lifetimes over their unloaded lifetimes
            (summed each; NaN for a transient).
    """

    verdict: str
    reason: str = ""
    attainment_half: float = math.nan
    slowdown_growth: float = math.nan
    slowdown: float = math.nan

    @property
    def stable(self) -> bool:
        return self.verdict == STABLE

    def to_dict(self) -> dict:
        return asdict(self)


def _ratio(lives: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(sum y / sum x, its variance by the ratio estimator) over (y, x) pairs."""
    y = np.array([p[0] for p in lives])
    x = np.array([p[1] for p in lives])
    ratio = float(y.sum() / x.sum())
    n = len(lives)
    variance = float(((y - ratio * x) ** 2).sum() / (n * (n - 1) * x.mean() ** 2)) if n > 1 else math.inf
    return ratio, variance


def slowdown_growth(sessions: Sequence[tuple[float, float, float]], start_s: float,
                    end_s: float) -> tuple[float, float, float]:
    """(growth as a fraction of the window's slowdown, growth in standard errors,
    the window's slowdown) of the sessions arriving in ``[start_s, end_s)``,
    last quarter against first (module docstring). ``sessions`` are (arrival s,
    lifetime s, unloaded lifetime s) of finished sessions. (0, 0, NaN) when the
    window has none, (0, 0, slowdown) when a quarter has none."""
    quarter_s = (end_s - start_s) / 4
    window = [(life, alone) for t, life, alone in sessions if start_s <= t < end_s]
    if not window:
        return 0.0, 0.0, math.nan
    mean = _ratio(window)[0]
    first = [(life, alone) for t, life, alone in sessions if start_s <= t < start_s + quarter_s]
    last = [(life, alone) for t, life, alone in sessions if end_s - quarter_s <= t < end_s]
    if not first or not last:
        return 0.0, 0.0, mean
    (first_r, first_var), (last_r, last_var) = _ratio(first), _ratio(last)
    delta = last_r - first_r
    se = math.sqrt(first_var + last_var)
    return delta / mean, delta / se if se > 0 else (math.inf if delta > 0 else 0.0), mean


def judge(attainment: float, attainment_half: float, sessions: Sequence[tuple[float, float, float]],
          start_s: float, end_s: float, stopped: str | None) -> Stability:
    """The verdict on a window run (module docstring).

    Args:
        attainment, attainment_half: over the whole window and its first half.
        sessions: (arrival s, lifetime s, unloaded lifetime s) of the finished
            sessions (those arriving in the window count).
        start_s, end_s: the window.
        stopped: why the simulation stopped early, or None when every measured
            session finished.
    """
    growth, growth_sd, slowdown = slowdown_growth(sessions, start_s, end_s)
    reasons = []
    if stopped is not None:
        reasons.append(stopped)
    if not abs(attainment - attainment_half) <= ATTAINMENT_TOLERANCE + 1e-12:  # 2.0 points is within; NaN is not
        reasons.append(f"attainment {100 * attainment_half:.1f} % over the window's first half, "
                       f"{100 * attainment:.1f} % over all of it")
    if growth > GROWTH_TOLERANCE and growth_sd > GROWTH_NOISE_SD:
        reasons.append(f"sessions' slowdown grew {100 * growth:.0f} % through the window")
    return Stability(UNSTABLE if reasons else STABLE, "; ".join(reasons), attainment_half, growth, slowdown)
