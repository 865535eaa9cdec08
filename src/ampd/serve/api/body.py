"""A client's request body, bounded and well-formed before anything reads it:
at most ``serve.max_body_bytes`` bytes (413 beyond, read no further), UTF-8
JSON nested at most ``serve.max_json_depth`` deep, and no number JSON does not
have (``NaN``, ``Infinity``, or a literal too large for a double, which Python
would read as infinite), and no string holding half a UTF-16 surrogate pair
(``"\\ud800"`` alone: valid JSON, but no UTF-8 text, so nothing could send it on to
an engine): each a 400 naming where it is. Every step is linear
in the body's length (the parser guards its own recursion)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator

from ampd.serve.rounds.round import ServeError

# A JSON string (skipped whole, so brackets inside it do not count) or a bracket.
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
# An escaped UTF-16 surrogate: the only way a lone one gets into a UTF-8 body.
_SURROGATE_ESCAPE = re.compile(rb'\\u[dD][89a-fA-F]')


class _NotANumber:
    """What the parser makes of a number JSON does not have (found afterwards, to name its field)."""

    def __init__(self, text: str) -> None:
        self.text = text


async def read_body(chunks: AsyncIterator[bytes], content_length: str | None, max_bytes: int) -> bytes:
    """The body, refused as soon as it is known to exceed ``max_bytes``.

    Raises:
        ServeError: 413 naming the limit.
    """
    too_large = ServeError(413, f"request body: larger than {max_bytes} bytes (serve.max_body_bytes)")
    if content_length is not None and content_length.isdigit() and int(content_length) > max_bytes:
        raise too_large
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise too_large
        parts.append(chunk)
    return b"".join(parts)


def json_depth(raw: bytes) -> int:
    """How deep the arrays and objects of a *valid* JSON text nest (0 for a
    scalar), strings skipped at C speed. Linear in the text's length for valid
    JSON only: in a string left open, every escaped quote would start a match
    that runs to the end (quadratic), hence ``parse_body`` parses first."""
    depth = deepest = 0
    for match in _TOKENS.finditer(raw):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif token in (b"]", b"}"):
            depth -= 1
    return deepest


def parse_body(raw: bytes, max_depth: int) -> dict:
    """A request body as a JSON object.

    Raises:
        ServeError: 400 for a body that is not UTF-8 JSON, not an object, nested
            deeper than ``max_depth``, holding NaN or an infinite number, or a
            lone surrogate in a string (the message names its field, e.g.
            ``temperature``, ``messages[0].content``).
    """
    seen: list[_NotANumber] = []

    def not_a_number(text: str) -> _NotANumber:
        seen.append(_NotANumber(text))
        return seen[-1]

    def double(text: str) -> float | _NotANumber:
        value = float(text)
        return value if math.isfinite(value) else not_a_number(text)

    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=not_a_number, parse_float=double)
    except UnicodeDecodeError as err:
        raise ServeError(400, f"request body: not UTF-8: {err.reason} at byte {err.start}") from None
    except RecursionError:  # the parser's own guard, far deeper than any limit allowed
        raise ServeError(400, f"request body: nested deeper than {max_depth} levels (serve.max_json_depth)") from None
    except ValueError as err:
        raise ServeError(400, f"request body: not valid JSON: {err}") from None
    if json_depth(raw) > max_depth:
        raise ServeError(400, f"request body: nested deeper than {max_depth} levels (serve.max_json_depth)")
    if not isinstance(body, dict):
        raise ServeError(400, "request body: expected a JSON object")
    if seen:  # only then is the body walked, to name the field
        path, value = _first(body, lambda v: isinstance(v, _NotANumber))
        raise ServeError(400, f"{path}: {value.text} is not a JSON number (JSON has no NaN or Infinity, and a "
                              "number must fit a double)")
    if _SURROGATE_ESCAPE.search(raw):  # pairs are fine: walked only to find a lone one
        found = _first(body, _lone_surrogate)
        if found is not None:
            raise ServeError(400, f"{found[0]}: a lone UTF-16 surrogate ({_escaped(found[1])}) is not text")
    return body


def _lone_surrogate(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _escaped(text: str) -> str:
    """``text`` with its surrogates as ``\\udxxx`` (an error message must be UTF-8)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _first(body: dict, bad) -> tuple[str, object] | None:
    """The field path (``a.b[2]``) and value of the first key or value that is
    ``bad``, depth first in the body's order; None when none is."""
    stack: list[tuple[str, object]] = [("", body)]
    while stack:
        path, value = stack.pop()
        if bad(value):
            return path, value
        if isinstance(value, dict):
            for key in reversed(value):
                if bad(key):
                    return f"{path}.{_escaped(key)}".lstrip("."), key
            stack.extend((f"{path}.{k}".lstrip("."), v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return None
