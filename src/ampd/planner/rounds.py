"""Every round of a workload as flat arrays, session by session: what the nominal stream
(``stream``) and the decode load (``decode_load``) are built from, read once from the
sessions instead of round by round (docs/PLANNER.md, "Planning time")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ampd.core.session import Session


@dataclass(frozen=True)
class RoundTable:
    """The rounds of ``sessions``, shape (m,) each, session after session in input order
    and each session's rounds in order.

    Attributes:
        session: index of the round's session in the input.
        round_index: the round's place in its session.
        input_tokens, output_tokens, tool_s: the round's (``Round``).
        history_tokens: every earlier round's input and output (``Session.history_tokens``).
        is_last: True for a session's last round.
        arrival_s: shape (sessions,), each session's arrival.
        first: shape (sessions,), index of each session's first round.
    """

    session: np.ndarray
    round_index: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    tool_s: np.ndarray
    history_tokens: np.ndarray
    is_last: np.ndarray
    arrival_s: np.ndarray
    first: np.ndarray

    @classmethod
    def of(cls, sessions: Sequence[Session]) -> "RoundTable":
        """Read ``sessions`` (each has at least one round, ``Session``)."""
        counts = np.array([len(s.rounds) for s in sessions], dtype=np.int64)
        rounds = [r for s in sessions for r in s.rounds]
        first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        session = np.repeat(np.arange(counts.size), counts)
        input_tokens = np.array([r.input_tokens for r in rounds], dtype=np.int64)
        output_tokens = np.array([r.output_tokens for r in rounds], dtype=np.int64)
        held = np.cumsum(input_tokens + output_tokens)
        history = held - (input_tokens + output_tokens) - np.repeat(held[first] - (input_tokens + output_tokens)[first],
                                                                    counts)
        is_last = np.zeros(held.size, dtype=bool)
        is_last[first + counts - 1] = True
        return cls(session, np.arange(held.size) - first[session], input_tokens, output_tokens,
                   np.array([float(r.tool_s) for r in rounds]), history, is_last,
                   np.array([float(s.arrival_s) for s in sessions]), first)

    def accumulate(self, start_s: np.ndarray, step_s: np.ndarray) -> np.ndarray:
        """Shape (m,): per round, its session's ``start_s`` (shape (sessions,)) plus the
        ``step_s`` (shape (m,)) of the session's earlier rounds, added one round at a
        time in order, as a loop over a session's rounds adds them (so the floats are
        the loop's, bit for bit)."""
        value = np.empty(self.session.size)
        value[self.first] = start_s
        rounds_of = np.diff(np.append(self.first, self.session.size))
        for r in range(1, int(rounds_of.max())):
            rows = self.first[rounds_of > r] + r
            value[rows] = value[rows - 1] + step_s[rows - 1]
        return value
