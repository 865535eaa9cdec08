"""Step functions over time built from +/- events, and weighted quantiles: how the
nominal stream measures batch concurrency and resident KV (docs/PLANNER.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q):
    """The smallest value whose cumulative weight reaches ``q`` of the total (a
    step-function quantile). Shapes: (n,), (n,), weights >= 0 with a positive sum; ``q``
    a float in (0, 1] (returns a float) or an array of them (returns an array)."""
    order = np.argsort(_small_integers(values), kind="stable")
    cumulative = np.cumsum(weights[order])
    index = np.searchsorted(cumulative, np.asarray(q) * cumulative[-1] * (1 - 1e-12))
    picked = values[order][np.minimum(index, len(values) - 1)]
    return float(picked) if np.ndim(q) == 0 else picked


def _small_integers(values: np.ndarray) -> np.ndarray:
    """``values`` as 16-bit integers when they all are (counts of sequences), whose stable
    sort is a radix sort, several times faster, giving the same order; else ``values``."""
    if values.size and -2**15 <= values.min() and values.max() < 2**15 and np.array_equal(values, np.rint(values)):
        return values.astype(np.int16)
    return values


@dataclass(frozen=True)
class Steps:
    """A step function that starts at 0 and jumps by ``deltas[i]`` at ``times_s[i]``,
    its events sorted by time.

    Attributes:
        times_s: shape (n,), event times, ascending.
        levels: shape (n,), the level right after each event.
        order: shape (n,), the permutation that sorted the events (``times_s`` is the
            input's ``[order]``).
    """

    times_s: np.ndarray
    levels: np.ndarray
    order: np.ndarray

    @classmethod
    def of(cls, times_s: np.ndarray, deltas: np.ndarray) -> "Steps":
        """The steps of events ``(times_s, deltas)``, shapes (n,). Events at one time may
        come out in any order (the sort need not be stable, which makes it several
        times faster): that changes the level on no interval of positive length, and
        what is read from here (``profile``, ``integral``) leaves zero-length intervals
        out or adds 0 for them."""
        order = np.argsort(times_s)
        return cls(times_s[order], np.cumsum(deltas[order]), order)

    def profile(self, window_s: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(level on each interval of positive length between consecutive events,
        its length in seconds); with ``window_s`` = (from, to), only the parts of the
        intervals inside it."""
        low, high = (-np.inf, np.inf) if window_s is None else window_s
        widths = np.clip(np.minimum(self.times_s[1:], high) - np.maximum(self.times_s[:-1], low), 0.0, None)
        inside = widths > 0
        return self.levels[:-1][inside], widths[inside]

    def integral(self) -> np.ndarray:
        """Shape (n,): the integral of the level from the first event to each event,
        in sorted order; linear in between, so ``np.interp`` over ``times_s`` is exact."""
        return np.concatenate([[0.0], np.cumsum(self.levels[:-1] * np.diff(self.times_s))])

    def integral_at_events(self) -> np.ndarray:
        """Shape (n,): ``integral`` at each event in the input's order (events at one
        time share one value: the intervals between them add 0)."""
        at = np.empty(self.order.size)
        at[self.order] = self.integral()
        return at


def interval_events(starts_s: np.ndarray, ends_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(times, deltas) of the step function counting the intervals ``[starts_s[i], ends_s[i])``
    that cover a time: +1 at each start, -1 at each end."""
    return np.concatenate([starts_s, ends_s]), np.concatenate([np.ones(starts_s.size), -np.ones(ends_s.size)])


def others_seen(busy: Steps, window_s: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The distribution of how many other intervals an instant of a randomly chosen
    interval overlaps (within ``window_s`` when given), ``busy`` being the steps of the
    intervals' ``interval_events``: (values b - 1, weights b x time), b(t) the number of
    intervals covering t. Its mean is ``integral b^2 / integral b - 1``; for a Poisson
    stream in steady state (M/G/inf) the distribution is the Poisson law of b itself."""
    level, width_s = busy.profile(window_s)
    covered = level > 0
    return level[covered] - 1.0, (level * width_s)[covered]
