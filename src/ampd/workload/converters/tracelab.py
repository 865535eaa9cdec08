"""UW SyFI TraceLab ``round_trace.jsonl`` -> sessions.

Source: uw-syfi/TraceLab (repository Apache-2.0, dataset CC-BY-4.0); field
notes in ``/work/shared/traces/tracelab-syfi/SOURCE.md``. One line = one LLM
round of a coding-agent session. Keys read (others ignored): ``session_id``,
``round_index`` (int >= 0), ``input_tokens_total``, ``newly_append_tokens``,
``output_tokens`` (ints >= 0), ``timing_events[].timestamp`` (ISO 8601 with a
time zone), ``tools[].tool_wall_latency_ms`` (ms >= 0 or null).

Mapping (rows grouped by ``session_id``, ordered by ``round_index``; gaps in
the indices are allowed, a repeated index is an error):
  * input of the first round = ``input_tokens_total``; of later rounds =
    ``newly_append_tokens`` (what the provider had to prefill beyond its cached
    prefix). We do not use the context growth ``input_tokens_total`` minus the
    previous round's total and output: with Codex it goes negative when
    reasoning is dropped from the history (-330 tokens in the shipped example);
  * tokens and outputs are clamped at >= 1 (a round always emits the token that
    comes out of its prefill);
  * ``tool_s`` = the largest ``tool_wall_latency_ms`` of the round's tools, in
    seconds: one assistant message issues them together and the next round waits
    for the slowest; in the example their intervals overlap (Claude: Bash and
    WebSearch emitted 0.8 s apart, both running; Codex: three exec_command
    within 50 ms), so a sum would count the overlap twice. A null latency counts
    as 0; a round without tools gets 0 (the user's think time before a next
    message is not an environment latency and is dropped);
  * ``arrival_s`` = earliest timing event of the session's first round, relative
    to the earliest such event in the file.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, Strict

from ampd.core.session import MAX_TIME_S, MAX_TOKENS, Round, Session
from ampd.workload.jsonl import read_json_lines
from ampd.workload.records import input_error, parse_record


class _TimingEvent(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    timestamp: Annotated[AwareDatetime, Strict(False)]


class _Tool(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    tool_wall_latency_ms: float | None = Field(default=None, ge=0.0, le=MAX_TIME_S * 1000, allow_inf_nan=False)


class _RoundRow(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    session_id: str = Field(min_length=1)
    round_index: int = Field(ge=0)
    input_tokens_total: int = Field(ge=0, le=MAX_TOKENS)
    newly_append_tokens: int = Field(ge=0, le=MAX_TOKENS)
    output_tokens: int = Field(ge=0, le=MAX_TOKENS)
    timing_events: list[_TimingEvent] = Field(default_factory=list)
    tools: list[_Tool] = Field(default_factory=list)


def convert_tracelab(path: str | Path) -> list[Session]:
    """Convert a TraceLab ``round_trace.jsonl`` (rules in the module doc).

    Returns:
        One session per ``session_id``, sorted by arrival.

    Raises:
        InputError: ``"<file>:<line>: <field>: ..."`` for invalid JSON, a
            missing or bad field, a ``round_index`` repeated within a session
            (both lines named), or a first round without timing events; also
            for an empty file.
    """
    rows_by_session: dict[str, dict[int, tuple[int, _RoundRow]]] = {}
    for line, data in read_json_lines(path):
        row = parse_record(_RoundRow, data, f"{path}:{line}")
        rows = rows_by_session.setdefault(row.session_id, {})
        if row.round_index in rows:
            raise input_error(f"{path}:{line}", "round_index",
                              f"{row.round_index} repeated in session {row.session_id!r} "
                              f"(first on line {rows[row.round_index][0]})")
        rows[row.round_index] = (line, row)
    ordered = [[rows[i] for i in sorted(rows)] for rows in rows_by_session.values()]
    starts = [_start_time(path, rows[0]) for rows in ordered]
    origin = min(starts)
    sessions = [Session(rows[0][1].session_id, (start - origin).total_seconds(), _rounds(rows))
                for rows, start in zip(ordered, starts)]
    return sorted(sessions, key=lambda s: s.arrival_s)


def _start_time(path: str | Path, first: tuple[int, _RoundRow]) -> datetime:
    line, row = first
    if not row.timing_events:
        raise input_error(f"{path}:{line}", "timing_events",
                          "empty on the session's first round, so its arrival is unknown")
    return min(event.timestamp for event in row.timing_events)


def _rounds(rows: list[tuple[int, _RoundRow]]) -> tuple[Round, ...]:
    rounds = []
    for position, (_, row) in enumerate(rows):
        new_tokens = row.input_tokens_total if position == 0 else row.newly_append_tokens
        latencies_ms = [tool.tool_wall_latency_ms or 0.0 for tool in row.tools]
        tool_s = max(latencies_ms, default=0.0) / 1000.0
        rounds.append(Round(max(1, new_tokens), max(1, row.output_tokens), tool_s))
    return tuple(rounds)
