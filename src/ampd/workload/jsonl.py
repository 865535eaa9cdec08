"""Reading JSON Lines files line by line, keeping line numbers for error messages."""

from __future__ import annotations

import json
from pathlib import Path

from ampd.core.errors import InputError


def read_text(path: str | Path) -> str:
    """The whole text of ``path`` (UTF-8, a leading byte-order mark dropped).

    Raises:
        InputError: the file is missing, is not a regular file (a directory, a
            device such as /dev/zero), or is not UTF-8.
    """
    path = Path(path)
    if path.exists() and not path.is_file():
        raise InputError(f"{path}: cannot read: not a regular file")
    try:
        return path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read: {exc}") from exc


def parse_json(text: str, where: str, name_line: bool = False) -> object:
    """One JSON value; ``where`` (``file:line``, or ``file`` with ``name_line``
    for a multi-line document, whose error then names the line) prefixes any error.

    Raises:
        InputError: invalid JSON, an integer of more than 4300 digits, or
            nesting too deep to parse.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        line = f":{exc.lineno}" if name_line else ""
        raise InputError(f"{where}{line}: json: {exc.msg} (column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{where}: json: {type(exc).__name__}: {str(exc)[:200]}") from None


def lines(text: str) -> list[str]:
    """Lines split at newlines only: JSON strings may hold U+2028 and other
    characters ``str.splitlines`` would break at."""
    return [line.removesuffix("\r") for line in text.split("\n")]


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
    for line_number, line in enumerate(lines(read_text(path)), start=1):
        if line.strip():
            records.append((line_number, parse_json(line, f"{path}:{line_number}")))
    if not records:
        raise InputError(f"{path}: empty: no JSON line in the file")
    return records
