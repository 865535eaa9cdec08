"""Piecewise alpha-beta cost functions (AMPD.md section 2) and their fit.

- ``PrefillCost``: ``T_pre(l_hist, l_incr) = alpha_k + beta_k l_incr
  + gamma l_incr (l_hist + l_incr / 2) + delta l_hist``, with segment k chosen by
  ``l_incr``. The gamma term is causal attention over history and new tokens; the delta
  term is reading the history's KV cache. Both are shared by all segments.
- ``DecodeCost``: ``T_dec(b, ctx) = alpha_k + beta_k b + gamma ctx``, segment k chosen by
  the batch size b, ctx the batch's KV tokens (reading it and attending over it).

Segment k covers sizes in ``(breakpoints[k-1], breakpoints[k]]``; the last one everything
above the last breakpoint. Fits minimise relative error with non-negative least squares in
a basis that can only step up and bend up at breakpoints, so a fitted time never decreases
with size; coefficients built or loaded otherwise that give a negative or decreasing time
are refused (``ImpossibleFitError``).
Evaluation is plain Python arithmetic: it runs millions of times per simulation.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ampd.core.errors import AmpdError, InputError

# Relative slack for float rounding when checking that time never decreases with size.
_ROUNDING = 1e-9


class ImpossibleFitError(AmpdError, ValueError):
    """Cost coefficients that would give a negative or non-monotone time."""


@dataclass(frozen=True, slots=True)
class Segments:
    """``alpha_s[k] + beta_s[k] * x`` for x in segment k (see the module docstring).

    Attributes:
        breakpoints: strictly increasing positive sizes; ``len(alpha_s) - 1`` of them.
        alpha_s: start-up cost of each segment, seconds.
        beta_s: cost per unit (token or sequence) of each segment, seconds.

    A segment's alpha may be negative (the line is only used right of its start), but
    every time must be >= 0 and non-decreasing in x.

    Raises:
        ImpossibleFitError: a negative or non-finite beta or time at a segment's start,
            or a step down at a breakpoint.
        InputError: breakpoints not strictly increasing and positive, or lengths disagree.
    """

    breakpoints: tuple[int, ...]
    alpha_s: tuple[float, ...]
    beta_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if not len(self.alpha_s) == len(self.beta_s) == len(self.breakpoints) + 1:
            raise InputError(f"segments: {len(self.breakpoints)} breakpoints need {len(self.breakpoints) + 1} "
                             f"alphas and betas, got {len(self.alpha_s)} and {len(self.beta_s)}")
        if any(b <= a for a, b in zip((0,) + self.breakpoints, self.breakpoints)):
            raise InputError(f"segments: breakpoints {self.breakpoints} must be positive and strictly increasing")
        starts = (0,) + self.breakpoints
        _check_coefficients(self.beta_s + tuple(self.value(k, x) for k, x in enumerate(starts)))
        for k, x in enumerate(self.breakpoints):
            left, right = self.value(k, x), self.value(k + 1, x)
            if right < left - _ROUNDING * abs(left):
                raise ImpossibleFitError(f"cost drops from {left:.6g} s to {right:.6g} s at breakpoint {x}: "
                                         "time must not decrease with size")

    def value(self, k: int, x: float) -> float:
        """``alpha_s[k] + beta_s[k] * x``, seconds."""
        return self.alpha_s[k] + self.beta_s[k] * x

    def to_dict(self) -> dict:
        return {"breakpoints": list(self.breakpoints), "alpha_s": list(self.alpha_s), "beta_s": list(self.beta_s)}

    @classmethod
    def from_dict(cls, data: dict) -> "Segments":
        return cls(tuple(data["breakpoints"]), tuple(data["alpha_s"]), tuple(data["beta_s"]))


@dataclass(frozen=True, slots=True)
class PrefillCost:
    """``T_pre(l_hist, l_incr)`` of one TP degree; segments over ``l_incr`` (tokens).

    Attributes:
        segments: alpha (s) and beta (s per new token) per segment.
        gamma_s_per_pair: seconds per attended (new token, key) pair.
        delta_s_per_hist_token: seconds per history token read.

    Raises:
        ImpossibleFitError: a negative or non-finite coefficient.
    """

    segments: Segments
    gamma_s_per_pair: float
    delta_s_per_hist_token: float

    def __post_init__(self) -> None:
        _check_coefficients((self.gamma_s_per_pair, self.delta_s_per_hist_token))

    def __call__(self, hist_tokens: int, new_tokens: int) -> float:
        """Seconds to prefill ``new_tokens`` on top of ``hist_tokens``."""
        seg = self.segments
        k = bisect_left(seg.breakpoints, new_tokens)
        return (seg.alpha_s[k] + seg.beta_s[k] * new_tokens + self.delta_s_per_hist_token * hist_tokens
                + self.gamma_s_per_pair * new_tokens * (hist_tokens + 0.5 * new_tokens))

    def array_s(self, hist_tokens: np.ndarray, new_tokens: np.ndarray) -> np.ndarray:
        """``__call__`` on every element of two integer arrays of one shape: the same
        segment (``searchsorted`` on the left is ``bisect_left``) and the same operations
        in the same order, so each element equals the scalar call's bit for bit."""
        seg = self.segments
        k = np.searchsorted(seg.breakpoints, new_tokens, side="left")
        return (np.asarray(seg.alpha_s)[k] + np.asarray(seg.beta_s)[k] * new_tokens
                + self.delta_s_per_hist_token * hist_tokens
                + self.gamma_s_per_pair * new_tokens * (hist_tokens + 0.5 * new_tokens))

    def to_dict(self) -> dict:
        return {"segments": self.segments.to_dict(), "gamma_s_per_pair": self.gamma_s_per_pair,
                "delta_s_per_hist_token": self.delta_s_per_hist_token}

    @classmethod
    def from_dict(cls, data: dict) -> "PrefillCost":
        return cls(Segments.from_dict(data["segments"]), data["gamma_s_per_pair"], data["delta_s_per_hist_token"])


@dataclass(frozen=True, slots=True)
class DecodeCost:
    """``T_dec(b, ctx)`` of one TP degree; segments over the batch size b.

    Attributes:
        segments: alpha (s) and beta (s per sequence) per segment.
        gamma_s_per_context_token: seconds per KV token of the batch.

    Raises:
        ImpossibleFitError: a negative or non-finite coefficient.
    """

    segments: Segments
    gamma_s_per_context_token: float

    def __post_init__(self) -> None:
        _check_coefficients((self.gamma_s_per_context_token,))

    def __call__(self, batch_size: int, context_tokens: int) -> float:
        """Seconds of one decode iteration."""
        seg = self.segments
        k = bisect_left(seg.breakpoints, batch_size)
        return seg.alpha_s[k] + seg.beta_s[k] * batch_size + self.gamma_s_per_context_token * context_tokens

    def to_dict(self) -> dict:
        return {"segments": self.segments.to_dict(), "gamma_s_per_context_token": self.gamma_s_per_context_token}

    @classmethod
    def from_dict(cls, data: dict) -> "DecodeCost":
        return cls(Segments.from_dict(data["segments"]), data["gamma_s_per_context_token"])


def fit_prefill(samples: Sequence[tuple[int, int, float]], breakpoints: Sequence[int]) -> PrefillCost:
    """Fit ``PrefillCost`` to ``(hist_tokens, new_tokens, time_s)`` samples.

    Raises:
        InputError: a sample with a non-positive or non-finite time, or a segment
            without samples.
    """
    hist = np.array([s[0] for s in samples], dtype=float)
    new = np.array([s[1] for s in samples], dtype=float)
    shared = np.column_stack([new * (hist + new / 2), hist])
    segments, (gamma, delta) = _fit(new, shared, _times(samples), tuple(breakpoints))
    return PrefillCost(segments, gamma, delta)


def fit_decode(samples: Sequence[tuple[int, int, float]], breakpoints: Sequence[int]) -> DecodeCost:
    """Fit ``DecodeCost`` to ``(batch_size, context_tokens, time_s)`` samples.

    Raises:
        InputError: a sample with a non-positive or non-finite time, or a segment
            without samples.
    """
    batch = np.array([s[0] for s in samples], dtype=float)
    context = np.array([[s[1]] for s in samples], dtype=float)
    segments, (gamma,) = _fit(batch, context, _times(samples), tuple(breakpoints))
    return DecodeCost(segments, gamma)


def _times(samples: Sequence[tuple[int, int, float]]) -> np.ndarray:
    times = np.array([s[2] for s in samples], dtype=float)
    if times.size == 0 or not np.all(np.isfinite(times) & (times > 0)):
        raise InputError("alpha-beta fit: samples must be non-empty with finite positive times")
    return times


def _fit(size: np.ndarray, shared: np.ndarray, times: np.ndarray,
         breakpoints: tuple[int, ...]) -> tuple[Segments, list[float]]:
    """NNLS on relative error in a basis that is monotone by construction: a start-up cost
    and a slope, then at each breakpoint an upward step and a slope increase (all >= 0),
    then the ``shared`` columns. Returns the segments and the shared coefficients."""
    segment = np.searchsorted(np.array(breakpoints), size, side="left")
    for k in range(len(breakpoints) + 1):
        if not (segment == k).any():
            raise InputError(f"alpha-beta fit: no samples in segment {k} (breakpoints {breakpoints})")
    columns = [np.ones_like(size), size]
    for x in breakpoints:
        beyond = (size > x).astype(float)
        columns += [beyond, beyond * (size - x)]
    design = np.column_stack(columns + [shared]) / times[:, None]
    scale = np.abs(design).max(axis=0)
    scale[scale == 0] = 1.0
    from scipy.optimize import nnls  # here: scipy.optimize costs ~0.8 s to import, and only a fit needs it

    coef, _ = nnls(design / scale, np.ones_like(times))
    coef = [float(c) for c in coef / scale]
    return _segments(breakpoints, coef[: 2 * len(breakpoints) + 2]), coef[2 * len(breakpoints) + 2:]


def _segments(breakpoints: tuple[int, ...], coef: list[float]) -> Segments:
    """Per-segment alpha and beta from (start-up, slope, then step and slope increase per
    breakpoint)."""
    alphas, betas = [coef[0]], [coef[1]]
    for k, x in enumerate(breakpoints):
        step, slope_up = coef[2 + 2 * k], coef[3 + 2 * k]
        alphas.append(alphas[-1] + step - slope_up * x)
        betas.append(betas[-1] + slope_up)
    return Segments(breakpoints, tuple(alphas), tuple(betas))


def _check_coefficients(values: Sequence[float]) -> None:
    bad = [v for v in values if not (math.isfinite(v) and v >= 0)]
    if bad:
        raise ImpossibleFitError(f"cost coefficients must be finite and >= 0 (a time cannot be negative); got {bad}")
