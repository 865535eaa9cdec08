"""TensorRT-LLM scaffolding trace-replay JSON (``*.trace.json``) -> sessions.

Source: NVIDIA/TensorRT-LLM ``examples/scaffolding/trace_replay`` (Apache-2.0);
format notes in ``/work/shared/traces/trtllm-trace-replay/SOURCE.md``. One file
is one agent run: ``{"trace_id", "events": [...]}`` with ``message`` events
(role system/user/assistant/tool; assistants carry ``prompt_tokens`` and
``completion_tokens``) and ``tool_call`` events (``duration_ms``).

Mapping (one assistant message = one round):
  * input of round 0 = its ``prompt_tokens``; of round r > 0 = ``prompt_tokens``
    minus the previous assistant's ``prompt_tokens + completion_tokens`` (the
    tokens new since the history), clamped at >= 1: the difference can drop to
    zero or below when a framework strips reasoning from the history;
  * output = ``completion_tokens``, clamped at >= 1 (a round always emits the
    token that comes out of its prefill);
  * ``tool_s`` of round r = sum of the ``duration_ms`` of the ``tool_call``
    events between that assistant message and the next, in seconds (tools of
    one step run one after the other in this scaffold);
  * session id = file name without ``.trace.json``; ``arrival_s`` = 0 (the
    format records no arrival: give arrivals with ``arrivals.with_poisson_arrivals``).
Parallel branches (non-empty ``branch_path``, ``parallel_start``/``parallel_end``)
are refused: a session here is one sequential chain of rounds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ampd.core.errors import InputError
from ampd.core.session import MAX_TIME_S, MAX_TOKENS, Round, Session
from ampd.workload.jsonl import parse_json, read_text
from ampd.workload.records import input_error, parse_record

SUFFIX = ".trace.json"


class _TraceFile(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    events: list[dict] = Field(min_length=1)


class _Event(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    event_type: Literal["message", "tool_call"]
    branch_path: list = Field(default_factory=list, max_length=0)


class _Assistant(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    prompt_tokens: int = Field(ge=1, le=MAX_TOKENS)
    completion_tokens: int = Field(ge=0, le=MAX_TOKENS)


class _ToolCall(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    duration_ms: float = Field(ge=0.0, le=MAX_TIME_S * 1000, allow_inf_nan=False)


def convert_trtllm(path: str | Path) -> list[Session]:
    """Convert one ``*.trace.json`` file, or every one in a directory tree.

    Returns:
        One session per file, sorted by arrival (all 0), then by file path.

    Raises:
        InputError: ``"<file>:<line>: json: ..."`` for invalid JSON,
            ``"<file>: events[<i>]: <field>: ..."`` for a bad event, a tool call
            before the first assistant message, a parallel branch, a file with
            no assistant message, or a directory with no ``*.trace.json``.
    """
    sessions, seen = [], {}
    for file in _trace_files(Path(path)):
        session = _convert_file(file)
        if session.session_id in seen:
            raise InputError(f"{file}: session id {session.session_id!r} (the file name) is also that of "
                             f"{seen[session.session_id]}; session ids must be unique")
        seen[session.session_id] = file
        sessions.append(session)
    return sessions


def _trace_files(path: Path) -> list[Path]:
    if not path.is_dir():
        return [path]
    files = sorted(path.rglob("*" + SUFFIX))
    if not files:
        raise InputError(f"{path}: no *{SUFFIX} file in this directory")
    return files


def _convert_file(file: Path) -> Session:
    events = parse_record(_TraceFile, _load_json(file), str(file)).events
    assistants: list[tuple[_Assistant, float]] = []
    for index, data in enumerate(events):
        where = f"{file}: events[{index}]"
        event = parse_record(_Event, data, where)
        if event.event_type == "tool_call":
            if not assistants:
                raise input_error(where, "event_type", "tool_call before any assistant message")
            tool_ms = parse_record(_ToolCall, data, where).duration_ms
            assistants[-1] = (assistants[-1][0], assistants[-1][1] + tool_ms)
        elif data.get("role") == "assistant":
            assistants.append((parse_record(_Assistant, data, where), 0.0))
    if not assistants:
        raise InputError(f"{file}: events: no assistant message, so no round")
    return Session(file.name.removesuffix(SUFFIX), 0.0, _rounds(assistants))


def _load_json(file: Path) -> object:
    return parse_json(read_text(file), str(file), name_line=True)


def _rounds(assistants: list[tuple[_Assistant, float]]) -> tuple[Round, ...]:
    rounds = []
    seen_tokens = 0
    for message, tool_ms in assistants:
        new_tokens = message.prompt_tokens - seen_tokens
        rounds.append(Round(max(1, new_tokens), max(1, message.completion_tokens), tool_ms / 1000.0))
        seen_tokens = message.prompt_tokens + message.completion_tokens
    return tuple(rounds)
