"""``session_id`` + ``delay`` JSON Lines -> sessions.

The "session trace" shape used by Mooncake-style replayers (NVIDIA AIPerf's
``mooncake_trace`` with ``session_id``, AIBrix, vLLM multi-turn benchmarks):
one line per request (= one round), rounds of a session in file order, sessions
interleaved freely. Keys read (others, e.g. ``hash_ids`` or ``messages``, are
ignored):

  * ``session_id``: string or integer (compared as text);
  * ``input_length`` or ``input_tokens`` (exactly one): int >= 1, the round's
    NEW input tokens; the replayer carries the history, as AIPerf does when it
    synthesises prompts from lengths;
  * ``output_length`` or ``output_tokens`` (exactly one): int >= 1;
  * ``delay`` (optional, default 0): milliseconds >= 0. On a session's first
    line: arrival after trace start. On a later line: wait after the previous
    round of the session ended, which becomes that previous round's ``tool_s``;
  * ``timestamp`` (optional, first line of a session only): arrival in
    milliseconds after trace start, instead of ``delay``. A later round's start
    depends on when the previous one ends, so an absolute time there is refused.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from ampd.core.session import MAX_TIME_S, MAX_TOKENS, Round, Session
from ampd.workload.jsonl import read_json_lines
from ampd.workload.records import input_error, parse_record


def _int_as_text(value: object) -> object:
    # Replayers number sessions as often as they name them; compare both as text.
    return str(value) if type(value) is int else value


class _TurnRow(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    session_id: Annotated[str, BeforeValidator(_int_as_text)] = Field(min_length=1)
    input_length: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    input_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    output_length: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    output_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    delay: float | None = Field(default=None, ge=0.0, le=MAX_TIME_S * 1000, allow_inf_nan=False)
    timestamp: float | None = Field(default=None, ge=0.0, le=MAX_TIME_S * 1000, allow_inf_nan=False)


def convert_session_delay(path: str | Path) -> list[Session]:
    """Convert a ``session_id`` + ``delay`` trace (keys and units in the module doc).

    Returns:
        Sessions sorted by arrival (ties keep first-appearance order).

    Raises:
        InputError: ``"<file>:<line>: <field>: ..."`` for invalid JSON, a
            missing, mistyped or negative field, both or neither of a key pair
            (``input_length``/``input_tokens``), ``timestamp`` and ``delay``
            together or ``timestamp`` on a later round; also for an empty file.
    """
    sessions: dict[str, Session] = {}
    for line, data in read_json_lines(path):
        where = f"{path}:{line}"
        row = parse_record(_TurnRow, data, where)
        previous = sessions.get(row.session_id)
        if previous is None:
            sessions[row.session_id] = Session(row.session_id, _arrival_s(where, row), (_round(where, row),))
        else:
            sessions[row.session_id] = _append(where, previous, row, _round(where, row))
    return sorted(sessions.values(), key=lambda s: s.arrival_s)


def _round(where: str, row: _TurnRow) -> Round:
    return Round(_one_of(where, row.input_length, row.input_tokens, "input_length", "input_tokens"),
                 _one_of(where, row.output_length, row.output_tokens, "output_length", "output_tokens"))


def _one_of(where: str, first: int | None, second: int | None, first_key: str, second_key: str) -> int:
    if (first is None) == (second is None):
        state = "both given" if first is not None else "missing"
        raise input_error(where, f"{first_key}|{second_key}", f"{state}: give exactly one")
    return first if first is not None else second


def _arrival_s(where: str, row: _TurnRow) -> float:
    if row.timestamp is not None and row.delay is not None:
        raise input_error(where, "timestamp|delay", "both given on a session's first line: give one")
    start_ms = row.timestamp if row.timestamp is not None else (row.delay or 0.0)
    return start_ms / 1000.0


def _append(where: str, session: Session, row: _TurnRow, new_round: Round) -> Session:
    if row.timestamp is not None:
        raise input_error(where, "timestamp",
                          f"only allowed on the first line of session {session.session_id!r}; use delay")
    last = replace(session.rounds[-1], tool_s=(row.delay or 0.0) / 1000.0)
    return replace(session, rounds=session.rounds[:-1] + (last, new_round))
