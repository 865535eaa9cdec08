"""Step functions over time built from +/- events, and weighted quantiles: how the
nominal stream measures batch concurrency and resident KV (docs/PLANNER.md)."""

from __future__ import annotations

import numpy as np


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q):
    """The smallest value whose cumulative weight reaches ``q`` of the total (a
    step-function quantile). Shapes: (n,), (n,), weights >= 0 with a positive sum; ``q``
    a float in (0, 1] (returns a float) or an array of them (returns an array)."""
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    index = np.searchsorted(cumulative, np.asarray(q) * cumulative[-1] * (1 - 1e-12))
    picked = values[order][np.minimum(index, len(values) - 1)]
    return float(picked) if np.ndim(q) == 0 else picked


def _sorted_levels(times_s: np.ndarray, deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(times_s, kind="stable")
    return times_s[order], np.cumsum(deltas[order])


def level_profile(times_s: np.ndarray, deltas: np.ndarray,
                  window_s: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The level of a step function that starts at 0 and jumps by ``deltas[i]`` at
    ``times_s[i]``: (level on each interval between consecutive events, interval
    lengths in seconds), shapes (n - 1,) each; with ``window_s`` = (from, to), only
    the parts of the intervals inside it (intervals outside it left out)."""
    sorted_s, levels = _sorted_levels(times_s, deltas)
    if window_s is None:
        return levels[:-1], np.diff(sorted_s)
    low, high = window_s
    widths = np.clip(np.minimum(sorted_s[1:], high) - np.maximum(sorted_s[:-1], low), 0.0, None)
    inside = widths > 0
    return levels[:-1][inside], widths[inside]


def level_integral(times_s: np.ndarray, deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same step function's integral: (event times sorted, integral of the level from
    the first event to each), shapes (n,); linear in between, so ``np.interp`` is exact."""
    sorted_s, levels = _sorted_levels(times_s, deltas)
    return sorted_s, np.concatenate([[0.0], np.cumsum(levels[:-1] * np.diff(sorted_s))])


def interval_events(starts_s: np.ndarray, ends_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(times, deltas) of the step function counting the intervals ``[starts_s[i], ends_s[i])``
    that cover a time: +1 at each start, -1 at each end."""
    return np.concatenate([starts_s, ends_s]), np.concatenate([np.ones(starts_s.size), -np.ones(ends_s.size)])


def others_seen(starts_s: np.ndarray, ends_s: np.ndarray,
                window_s: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The distribution of how many other intervals an instant of a randomly chosen
    interval overlaps (within ``window_s`` when given): (values b - 1, weights b x
    time), b(t) the number of intervals covering t. Its mean is
    ``integral b^2 / integral b - 1``; for a Poisson stream in steady state
    (M/G/inf) the distribution is the Poisson law of b itself."""
    level, width_s = level_profile(*interval_events(starts_s, ends_s), window_s)
    covered = level > 0
    return level[covered] - 1.0, (level * width_s)[covered]
