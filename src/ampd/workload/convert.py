"""One entry point for every trace format: by name, or guessed from the file."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ampd.core.errors import InputError
from ampd.core.names import unknown_name
from ampd.core.session import Session
from ampd.workload.converters import (
    convert_mooncake, convert_session_delay, convert_tracelab, convert_trtllm)
from ampd.workload.jsonl import lines, parse_json, read_text
from ampd.workload.trace_format import load_trace

CONVERTERS: dict[str, Callable[[str | Path], list[Session]]] = {
    "ampd": load_trace,
    "trtllm": convert_trtllm,
    "mooncake": convert_mooncake,
    "tracelab": convert_tracelab,
    "session-delay": convert_session_delay,
}
FORMATS = tuple(CONVERTERS)

# Keys that identify a JSON Lines format from its first record, most specific
# first: a session-delay line may also carry Mooncake's hash_ids.
_KEYS_OF_FORMAT = (
    ("ampd", "rounds"),
    ("tracelab", "round_index"),
    ("session-delay", "session_id"),
    ("mooncake", "hash_ids"),
)


def convert(path: str | Path, fmt: str) -> list[Session]:
    """Load ``path`` written in format ``fmt`` (one of ``FORMATS``).

    Returns:
        Sessions sorted by arrival.

    Raises:
        InputError: unknown ``fmt`` (the message lists ``FORMATS``), or any
            error of that format's loader (file and line named).
    """
    if fmt not in CONVERTERS:
        raise InputError(unknown_name("trace format", fmt, FORMATS))
    return CONVERTERS[fmt](path)


def load_any(path: str | Path, fmt: str | None = None) -> list[Session]:
    """Like ``convert``, guessing ``fmt`` when it is None (see ``guess_format``)."""
    return convert(path, fmt or guess_format(path))


def guess_format(path: str | Path) -> str:
    """Name the format of ``path``: a directory or a ``.json`` file is trtllm;
    otherwise the keys of the first non-blank JSON line decide.

    Raises:
        InputError: unreadable file, or no format recognised (the message
            lists ``FORMATS`` so the caller can name one).
    """
    path = Path(path)
    if path.is_dir() or path.suffix == ".json":
        return "trtllm"
    keys = _first_record_keys(path)
    for fmt, key in _KEYS_OF_FORMAT:
        if key in keys:
            return fmt
    raise InputError(f"{path}: cannot tell the trace format from keys {sorted(keys)}; "
                     f"name one of: {', '.join(FORMATS)}")


def _first_record_keys(path: Path) -> set[str]:
    for line_number, line in enumerate(lines(read_text(path)), start=1):
        if line.strip():
            record = parse_json(line, f"{path}:{line_number}")
            if not isinstance(record, dict):
                raise InputError(f"{path}:{line_number}: expected a JSON object, got {type(record).__name__}")
            return set(record)
    raise InputError(f"{path}: empty: no JSON line in the file")
