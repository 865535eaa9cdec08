"""Endless session streams, so a run can be as long as its measurement needs
(docs/SIMULATOR.md, "Steady state").

A stream yields sessions in the order they arrive, with ``arrival_s`` left at 0;
arrival times come separately (``poisson_until``, or a recorded pattern
``repeated``), Poisson ones from a generator of their own, so the same seed
gives the same sessions at every rate and every run length.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace

import numpy as np

from ampd.core.errors import InputError
from ampd.core.session import Session
from ampd.workload.arrivals import check_positive

REPEAT_SEPARATOR = "#"  # a trace's k-th repeat of session "s1" is "s1#k" (k >= 1)


def cycled(sessions: Sequence[Session]) -> Iterator[Session]:
    """A trace's sessions in order, then again and again; each repeat gets a new id
    (``<id>#<k>`` on the k-th repeat) so every session of a run is distinct.

    Raises:
        InputError: the trace holds no session.
    """
    if not sessions:
        raise InputError("the trace holds no session")
    for k in itertools.count():
        for s in sessions:
            yield s if k == 0 else replace(s, session_id=f"{s.session_id}{REPEAT_SEPARATOR}{k}")


def sampled(sessions: Sequence[Session], rng: np.random.Generator) -> Iterator[Session]:
    """A trace's sessions drawn uniformly at random, with replacement, for ever; the
    n-th draw of session ``s1`` is renamed ``s1#n`` (n counts every draw from 0), so
    every session of a run is distinct. A stationary mix of the trace's sessions,
    whatever order (time of day, say) they were recorded in: what a steady state
    of that traffic is.

    Raises:
        InputError: the trace holds no session.
    """
    if not sessions:
        raise InputError("the trace holds no session")
    for n in itertools.count():
        s = sessions[int(rng.integers(len(sessions)))]
        yield replace(s, session_id=f"{s.session_id}{REPEAT_SEPARATOR}{n}")


def poisson_until(horizon_s: float, rate_per_s: float, rng: np.random.Generator) -> list[float]:
    """Arrival times (s) of a Poisson process of ``rate_per_s`` in ``(0, horizon_s)``:
    exponential gaps, the first one after t = 0 (as ``poisson_arrivals``).

    Raises:
        InputError: ``rate_per_s`` or ``horizon_s`` not finite and > 0.
    """
    check_positive("rate_per_s", rate_per_s)
    check_positive("horizon_s", horizon_s)
    times: list[float] = []
    t = 0.0
    # Gaps drawn in blocks give the same times as drawn one by one: a shorter horizon's
    # arrivals are a prefix of a longer one's.
    block = max(16, int(1.2 * horizon_s * rate_per_s))
    while True:
        for gap in rng.exponential(1.0 / rate_per_s, size=block):
            t += float(gap)
            if t >= horizon_s:
                return times
            times.append(t)


def repeated(times_s: Sequence[float]) -> Iterator[float]:
    """A recorded arrival pattern (seconds, sorted, at least two distinct times)
    at its own times, then repeated back to back for ever: the k-th repeat is the
    pattern shifted by k periods. The period is the span plus one mean gap, so
    the rate stays ``(n - 1) / span`` (``arrival_rate_per_s``) across the seams.

    Raises:
        InputError: fewer than two times, or all equal.
    """
    if len(times_s) < 2 or times_s[-1] <= times_s[0]:
        raise InputError("recorded arrivals need at least two sessions at different times; "
                         "use arrivals = 'poisson'")
    period_s = (times_s[-1] - times_s[0]) * len(times_s) / (len(times_s) - 1)
    for k in itertools.count():
        for t in times_s:
            yield t + k * period_s


def with_arrivals(stream: Iterable[Session], times_s: Sequence[float]) -> list[Session]:
    """The first ``len(times_s)`` sessions of ``stream``, arriving at ``times_s``."""
    return [replace(s, arrival_s=t) for s, t in zip(stream, times_s)]
