"""Arrival processes and rate changes for a list of sessions.

Randomness always comes from a ``numpy.random.Generator`` the caller passes in
(seeded by the run's configuration), never from global state, so a run can be
reproduced. Times are seconds after the trace start (t = 0).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

import numpy as np

from ampd.core.errors import InputError
from ampd.core.session import Session


def poisson_arrivals(num: int, rate_per_s: float, rng: np.random.Generator) -> list[float]:
    """``num`` arrival times (s) of a Poisson process of ``rate_per_s``: gaps are
    exponential with mean ``1 / rate_per_s``, and the first arrival is itself
    one gap after t = 0.

    Raises:
        InputError: ``num < 0``, or ``rate_per_s`` not finite and > 0.
    """
    if num < 0:
        raise InputError(f"num: must be >= 0, got {num}")
    check_positive("rate_per_s", rate_per_s)
    gaps_s = rng.exponential(1.0 / rate_per_s, size=num)
    return [float(t) for t in np.cumsum(gaps_s)]


def with_poisson_arrivals(sessions: Sequence[Session], rate_per_s: float,
                          rng: np.random.Generator) -> list[Session]:
    """The same sessions, in the same order, with Poisson arrival times
    (``poisson_arrivals``); rounds untouched.

    Raises:
        InputError: ``rate_per_s`` not finite and > 0.
    """
    times_s = poisson_arrivals(len(sessions), rate_per_s, rng)
    return [replace(s, arrival_s=t) for s, t in zip(sessions, times_s)]


def rescale_rate(sessions: Sequence[Session], factor: float) -> list[Session]:
    """Divide every arrival time by ``factor``, so the arrival rate grows by
    ``factor`` (2.0: twice the load); rounds and tool latencies untouched.

    Raises:
        InputError: ``factor`` not finite and > 0.
    """
    check_positive("factor", factor)
    return [replace(s, arrival_s=s.arrival_s / factor) for s in sessions]


def arrival_rate_per_s(sessions: Sequence[Session]) -> float:
    """Rate of a trace, sessions/s: ``(n - 1) / span``, the inverse of its mean gap
    between consecutive arrivals, the span running from the first arrival to the
    last (0, 2.5, 5.0 s: 0.4). It does not depend on where the trace's clock
    starts, and it is the long-run rate of the pattern repeated back to back
    (``ampd.workload.repeated``), as a steady-state run replays it.

    Raises:
        InputError: fewer than two sessions, or all arriving at one time.
    """
    times_s = sorted(s.arrival_s for s in sessions)
    if len(times_s) < 2 or times_s[-1] <= times_s[0]:
        raise InputError(f"arrival rate: undefined for {len(sessions)} session(s) that do not arrive at "
                         f"different times")
    return (len(times_s) - 1) / (times_s[-1] - times_s[0])


def take(sessions: Sequence[Session], n: int) -> list[Session]:
    """The first ``n`` sessions of the list.

    Raises:
        InputError: ``n`` negative or larger than the number of sessions.
    """
    if not 0 <= n <= len(sessions):
        raise InputError(f"take: n must be in [0, {len(sessions)}], got {n}")
    return list(sessions[:n])


def check_positive(name: str, value: float) -> None:
    """Raises InputError naming ``name`` unless ``value`` is finite and > 0."""
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"{name}: must be a finite number > 0, got {value}")
