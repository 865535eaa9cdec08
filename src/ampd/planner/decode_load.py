"""The decode load of a workload as a function of the pace of its tokens: how many
sequences a token shares a decode step with, and how much KV the sessions hold
(docs/PLANNER.md, "Decode side").

Both come from the sessions' own timeline, not from a steady-state formula, so a short
workload that never reaches a steady state is not planned as if it did. At a pace of
``p`` seconds per output token, round r of a session is ready at
``arrival + sum_{j<r} (output_j p + tool_j)``, decodes from one token slot after that
until ``output_r p`` after it, and reserves its input + output of KV when it starts;
the session's KV is released when its last round ends (the simulator's rule). The
planner needs the pace a decode replica delivers, which depends on its load, so the
load is tabulated once over a grid of paces and interpolated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ampd.planner.rounds import RoundTable
from ampd.planner.timeline import Steps, interval_events, others_seen, weighted_quantile

# Paces tabulated: log-spaced from 1 ms to this many ITL thresholds; beyond, the values
# at the last point (a replica that slow is far past its SLO anyway).
_GRID_POINTS = 32
_GRID_TOP_THRESHOLDS = 10.0
# Quantile levels that stand for the distribution of the batch a token sees.
OTHERS_LEVELS = (np.arange(20) + 0.5) / 20


@dataclass(frozen=True)
class DecodeLoad:
    """Decode load over a grid of paces, all decode replicas together.

    Attributes:
        pace_s: shape (G,), seconds per output token, increasing.
        others: shape (G,), other sequences a decoding token shares its step with, on
            average over tokens (``timeline.others_seen``).
        others_quantiles: shape (G, len(OTHERS_LEVELS)), that count's distribution over
            tokens at ``OTHERS_LEVELS``.
        session_others_p95: shape (G,), P95 over sessions of the mean of that count over a
            session's tokens (what its mean ITL depends on).
        kv_p95_tokens: shape (G,), P95 over time of the KV all sessions hold.
        mean_context_tokens: KV context of one decoded token, averaged over tokens.
    """

    pace_s: np.ndarray
    others: np.ndarray
    others_quantiles: np.ndarray
    session_others_p95: np.ndarray
    kv_p95_tokens: np.ndarray
    mean_context_tokens: float

    def others_at(self, pace_s: float) -> float:
        """``others`` interpolated at ``pace_s``."""
        return float(np.interp(pace_s, self.pace_s, self.others))

    def others_quantiles_at(self, pace_s: float) -> np.ndarray:
        """``others_quantiles`` interpolated at ``pace_s``, shape (len(OTHERS_LEVELS),)."""
        return np.array([np.interp(pace_s, self.pace_s, column) for column in self.others_quantiles.T])

    def session_others_p95_at(self, pace_s: float) -> float:
        """``session_others_p95`` interpolated at ``pace_s``."""
        return float(np.interp(pace_s, self.pace_s, self.session_others_p95))

    def kv_p95_tokens_at(self, pace_s: float) -> float:
        """``kv_p95_tokens`` interpolated at ``pace_s``."""
        return float(np.interp(pace_s, self.pace_s, self.kv_p95_tokens))


def build_decode_load(table: RoundTable, itl_slo_s: float,
                      window_s: tuple[float, float] | None = None) -> DecodeLoad:
    """Tabulate the decode load of the sessions of ``table`` (module docstring) up to
    ``_GRID_TOP_THRESHOLDS`` x ``itl_slo_s`` per token. With ``window_s`` =
    (from, to), a steady-state stream's measurement window: the load over time
    is read inside it only, and the per-session P95 over the sessions arriving in it."""
    rounds = _Rounds.of(table, window_s)
    grid = np.geomspace(1e-3, max(_GRID_TOP_THRESHOLDS * itl_slo_s, 2e-3), _GRID_POINTS)
    columns = [np.array(c) for c in zip(*(rounds.load_at(p) for p in grid))]
    steps = rounds.output_tokens - 1
    context_sum = float(np.sum(steps * rounds.prefilled_tokens + steps * (steps + 1) / 2))
    return DecodeLoad(grid, *columns, context_sum / max(1, int(steps.sum())))


@dataclass(frozen=True)
class _Rounds:
    """Every round of every session, shape (m,) each: the session's index, ready time at
    pace 0, output tokens of the session's earlier rounds, output tokens, KV the round
    reserves, KV released at its end (the session's total after its last round, else
    0), and the KV context once its input is prefilled; the window the load is read
    in (None: all of it) and, shape (sessions,), whether each session is measured."""

    window_s: tuple[float, float] | None
    measured: np.ndarray
    session: np.ndarray
    base_s: np.ndarray
    earlier_output_tokens: np.ndarray
    output_tokens: np.ndarray
    reserved_tokens: np.ndarray
    released_tokens: np.ndarray
    prefilled_tokens: np.ndarray

    @classmethod
    def of(cls, table: RoundTable, window_s: tuple[float, float] | None) -> "_Rounds":
        arrival_s = table.arrival_s
        measured = np.ones(arrival_s.size, dtype=bool) if window_s is None else (
            (window_s[0] <= arrival_s) & (arrival_s < window_s[1]))
        own = table.input_tokens + table.output_tokens
        return cls(window_s, measured, table.session, table.accumulate(arrival_s, table.tool_s),
                   table.accumulate(np.zeros(arrival_s.size), table.output_tokens.astype(float)),
                   table.output_tokens.astype(float), own.astype(float),
                   np.where(table.is_last, table.history_tokens + own, 0).astype(float),
                   (table.history_tokens + table.input_tokens).astype(float))

    def load_at(self, pace_s: float) -> tuple[float, np.ndarray, float, float]:
        """The ``DecodeLoad`` columns at ``pace_s`` per token: mean others, others at
        ``OTHERS_LEVELS``, P95 over sessions of their mean others, P95 resident KV tokens.
        No decoding at all gives 0 others."""
        ready_s = self.base_s + self.earlier_output_tokens * pace_s
        end_s = ready_s + self.output_tokens * pace_s
        ends = self.released_tokens > 0
        kv = Steps.of(np.concatenate([ready_s, end_s[ends]]),
                      np.concatenate([self.reserved_tokens, -self.released_tokens[ends]]))
        kv_tokens = math.ceil(weighted_quantile(*kv.profile(self.window_s), 0.95))
        decoding_from_s = ready_s + pace_s
        busy = Steps.of(*interval_events(decoding_from_s, end_s))
        others, weights = others_seen(busy, self.window_s)
        if others.size == 0:
            return 0.0, np.zeros(OTHERS_LEVELS.size), 0.0, kv_tokens
        mean = float(np.sum(others * weights) / np.sum(weights))
        return (mean, weighted_quantile(others, weights, OTHERS_LEVELS),
                self._session_others_p95(busy, end_s - decoding_from_s), kv_tokens)

    def _session_others_p95(self, busy: Steps, decoding_s: np.ndarray) -> float:
        """P95 over the sessions that decode of the mean number of other sequences their
        tokens share a step with (a session's tokens are evenly spaced in its rounds);
        ``busy``: the steps of the rounds' decoding intervals (starts, then ends), each
        ``decoding_s`` long."""
        at = busy.integral_at_events()
        covered = at[decoding_s.size:] - at[:decoding_s.size]
        session_s = np.bincount(self.session, decoding_s, minlength=self.measured.size)
        counted = (session_s > 0) & self.measured
        mean_level = np.bincount(self.session, covered, minlength=self.measured.size)[counted] / session_s[counted]
        return weighted_quantile(mean_level - 1.0, np.ones(mean_level.size), 0.95)
