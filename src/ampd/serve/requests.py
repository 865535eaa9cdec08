"""Client requests to the coordinator: OpenAI ``/v1/completions`` and
``/v1/chat/completions`` bodies checked and turned into a ``RoundRequest``.
Every refusal is a 400 that names the field."""

from __future__ import annotations

from collections.abc import Mapping

from ampd.core.session import MAX_TOKENS
from ampd.serve.rounds import RoundRequest, ServeError

SESSION_HEADER = "x-session-id"
LAST_ROUND_HEADER = "x-session-last-round"
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
MAX_SESSION_ID_CHARS = 256
MAX_TOKEN_ID = 2**31 - 1
# Fields the coordinator sets itself on engine requests; the rest pass through.
_OWN_FIELDS = {"model", "prompt", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options",
               "session_id", "session_end", "return_token_ids", "kv_transfer_params"}


def _bad(message: str) -> ServeError:
    return ServeError(400, message)


def session_id_of(body: Mapping, headers: Mapping[str, str]) -> str:
    """The session id: the ``X-Session-Id`` header, else the body's ``session_id``.

    Raises:
        ServeError: 400 when missing, empty, too long or not a string.
    """
    value = headers.get(SESSION_HEADER, body.get("session_id"))
    if value is None:
        raise _bad("missing session id: send an X-Session-Id header or a session_id field")
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_SESSION_ID_CHARS:
        raise _bad(f"session_id: must be a non-empty string of at most {MAX_SESSION_ID_CHARS} characters")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise _bad("session_id: control characters (CR, LF, NUL, ...) are not allowed")
    return value


def prompt_ids(value: object, field: str = "prompt") -> tuple[int, ...]:
    """A prompt given as token ids.

    Raises:
        ServeError: 400 unless a non-empty list of integers in [0, 2^31).
    """
    if not isinstance(value, list) or not value:
        raise _bad(f"{field}: must be a non-empty list of token ids (or a string)")
    if len(value) > MAX_TOKENS:
        raise _bad(f"{field}: {len(value)} tokens, more than {MAX_TOKENS}")
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID for t in value):
        raise _bad(f"{field}: every token id must be an integer in [0, {MAX_TOKEN_ID}]")
    return tuple(value)


def max_tokens_of(body: Mapping) -> int:
    """``max_tokens`` (or chat's ``max_completion_tokens``), default 16.

    Raises:
        ServeError: 400 unless an integer in [1, MAX_TOKENS].
    """
    value = body.get("max_tokens", body.get("max_completion_tokens", DEFAULT_MAX_TOKENS))
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_TOKENS:
        raise _bad(f"max_tokens: must be an integer in [1, {MAX_TOKENS}], got {value!r}")
    return value


def check_common(body: Mapping) -> bool:
    """Check the fields every request shares; the value of ``stream``.

    Raises:
        ServeError: 400 for a bad ``stream`` or ``n`` other than 1.
    """
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad(f"stream: must be true or false, got {stream!r}")
    n = body.get("n", 1)
    if type(n) is not int or n != 1:
        raise _bad(f"n: only n = 1 is supported (one sequence per round), got {n!r}")
    options = body.get("stream_options")
    if options is not None and not (isinstance(options, dict) and isinstance(options.get("include_usage", False), bool)):
        raise _bad(f"stream_options: must be an object like {{\"include_usage\": true}}, got {options!r}")
    return stream


def check_messages(value: object) -> list[dict]:
    """Chat ``messages``: a non-empty list of ``{"role": str, "content": str}``.

    Raises:
        ServeError: 400 naming the first bad message.
    """
    if not isinstance(value, list) or not value:
        raise _bad("messages: must be a non-empty list of {role, content} objects")
    for i, message in enumerate(value):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise _bad(f"messages[{i}]: must be an object with string role and content")
    return value


def round_request(body: Mapping, headers: Mapping[str, str], prompt: tuple[int, ...]) -> RoundRequest:
    """The round a checked request asks for, its prompt already in token ids."""
    last = headers.get(LAST_ROUND_HEADER, "").lower() in ("1", "true", "yes") or body.get("session_end") is True
    params = {k: v for k, v in body.items() if k not in _OWN_FIELDS}
    return RoundRequest(session_id_of(body, headers), prompt, max_tokens_of(body), params, last)
