"""Reading JSON Lines files line by line, keeping line numbers for error messages."""

from __future__ import annotations

import json
from pathlib import Path

from ampd.core.errors import InputError


def read_text(path: str | Path) -> str:
    """The whole text of ``path`` (UTF-8).

    Raises:
        InputError: the file is missing, is a directory, or is not UTF-8.
    """
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from exc


def read_json_lines(path: str | Path) -> list[tuple[int, object]]:
    """Parse a JSON Lines file.

    Returns:
        ``(line_number, value)`` per non-blank line; line numbers count from 1
        and include the blank lines skipped, so they match an editor's.

    Raises:
        InputError: unreadable file; a line that is not valid JSON
            (``"<file>:<line>: json: <why>"``); a file with no non-blank line.
    """
    records = []
    for line_number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            records.append((line_number, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{line_number}: json: {exc.msg} (column {exc.colno})") from exc
    if not records:
        raise InputError(f"{path}: empty: no JSON line in the file")
    return records
