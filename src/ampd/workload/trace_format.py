"""The project's own trace format (DESIGN.md section 6): JSON Lines, one session
per line::

    {"session_id": "s1", "arrival_s": 0.0,
     "rounds": [{"input_tokens": 703, "output_tokens": 120, "tool_s": 1.2},
                {"input_tokens": 350, "output_tokens": 80}]}

``input_tokens`` is the round's new input (round 0: the prompt; later rounds:
the tool output), ``output_tokens`` the tokens the model generates in that
round, ``tool_s`` the environment latency after the round (optional, default
0, ignored after the last round). Blank lines are skipped; unknown keys are
errors, so a misspelt field cannot silently fall back to a default.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from pydantic import BaseModel, ConfigDict, Field

from ampd.core.session import MAX_TIME_S, MAX_TOKENS, Round, Session
from ampd.workload.jsonl import read_json_lines
from ampd.workload.records import input_error, parse_record


class RoundRecord(BaseModel):
    """One round as stored: tokens are ints >= 1, ``tool_s`` finite seconds >= 0."""

    model_config = ConfigDict(strict=True, extra="forbid")

    input_tokens: int = Field(ge=1, le=MAX_TOKENS)
    output_tokens: int = Field(ge=1, le=MAX_TOKENS)
    tool_s: float = Field(default=0.0, ge=0.0, le=MAX_TIME_S, allow_inf_nan=False)


class SessionRecord(BaseModel):
    """One line of a trace: a non-empty id, a finite arrival >= 0 s, >= 1 round."""

    model_config = ConfigDict(strict=True, extra="forbid")

    session_id: str = Field(min_length=1)
    arrival_s: float = Field(ge=0.0, le=MAX_TIME_S, allow_inf_nan=False)
    rounds: list[RoundRecord] = Field(min_length=1)

    def to_session(self) -> Session:
        rounds = tuple(Round(r.input_tokens, r.output_tokens, r.tool_s) for r in self.rounds)
        return Session(self.session_id, self.arrival_s, rounds)


def load_trace(path: str | Path) -> list[Session]:
    """Load a trace in the project's format.

    Returns:
        The sessions sorted by ``arrival_s`` (ties keep file order).

    Raises:
        InputError: ``"<file>:<line>: <field>: <what is wrong>"`` for invalid
            JSON, a missing, mistyped or out-of-range field, an unknown key, or
            a session id already used on an earlier line (both lines named);
            also for an unreadable or empty file.
    """
    first_line_of: dict[str, int] = {}
    sessions = []
    for line_number, data in read_json_lines(path):
        record = parse_record(SessionRecord, data, f"{path}:{line_number}")
        if record.session_id in first_line_of:
            raise input_error(
                f"{path}:{line_number}", "session_id",
                f"duplicate {record.session_id!r} (first on line {first_line_of[record.session_id]})")
        first_line_of[record.session_id] = line_number
        sessions.append(record.to_session())
    return sorted(sessions, key=lambda s: s.arrival_s)


def save_trace(sessions: Iterable[Session], path: str | Path) -> None:
    """Write ``sessions`` to ``path`` in the project's format, one per line, in
    the order given; ``tool_s`` is written only when non-zero."""
    lines = [json.dumps(_session_json(s)) for s in sessions]
    Path(path).write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _session_json(session: Session) -> dict:
    return {
        "session_id": session.session_id,
        "arrival_s": session.arrival_s,
        "rounds": [_round_json(r) for r in session.rounds],
    }


def _round_json(round_: Round) -> dict:
    data = {"input_tokens": round_.input_tokens, "output_tokens": round_.output_tokens}
    if round_.tool_s:
        data["tool_s"] = round_.tool_s
    return data
