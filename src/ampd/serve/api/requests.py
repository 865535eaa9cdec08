"""Client requests to the coordinator: OpenAI ``/v1/completions`` and
``/v1/chat/completions`` bodies checked and turned into a ``RoundRequest``.
Every refusal is a 400 that names the field."""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping

from ampd.core.session import MAX_TOKENS
from ampd.serve.rounds.round import FROM_PROMPT, RoundRequest, ServeError

SESSION_HEADER = "X-Session-Id"  # header lookups ignore case (HTTP; Starlette's Headers)
SESSION_FIELD, CACHE_KEY_FIELD = "session_id", "prompt_cache_key"
LAST_ROUND_HEADER = "X-Session-Last-Round"
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
MAX_SESSION_ID_CHARS = 256
MAX_TOKEN_ID = 2**31 - 1
# Fields the coordinator sets itself on engine requests, or that only it reads; the rest
# pass through to the engines. A chat round is sent to the engines' own chat endpoint
# (docs/SERVING.md, "Chat and agents"), so everything that steers the chat server
# (``tools``, ``tool_choice``, ``response_format``, the template's fields) passes; a
# completion's prompt is token ids, and the chat-only fields have nothing to steer there.
_COORDINATOR_FIELDS = frozenset({"model", "max_tokens", "max_completion_tokens", "stream", "stream_options",
                                 "session_id", "session_end", "return_token_ids", "kv_transfer_params",
                                 "prompt_cache_key"})
_OWN_FIELDS = {"completions": _COORDINATOR_FIELDS | {"prompt", "messages", "tools", "tool_choice",
                                                     "parallel_tool_calls"},
               "chat": _COORDINATOR_FIELDS | {"messages"}}
# The chat fields that change how a chat template renders the prompt (vLLM's
# ``TokenizeChatRequest`` takes each): the coordinator's ``/tokenize`` call must see them
# as the engines' chat endpoints do, or the token ids the policies count are another prompt's.
TEMPLATE_FIELDS = ("tools", "add_generation_prompt", "continue_final_message", "add_special_tokens", "chat_template",
                   "chat_template_kwargs")


# Unicode categories refused in session ids: controls (C0, C1), format characters (bidi
# overrides such as U+202E, zero-width ones), lone surrogates, line and paragraph separators.
# [our choice] Each makes an id print unlike what it is, or breaks a log line.
_REFUSED_CATEGORIES = {"Cc": "control", "Cf": "format (bidi or invisible)", "Cs": "surrogate",
                       "Zl": "line separator", "Zp": "paragraph separator"}
_TRUE, _FALSE = ("1", "true", "yes"), ("", "0", "false", "no")


def _bad(message: str) -> ServeError:
    return ServeError(400, message)


def header_text(headers: Mapping[str, str], name: str) -> str | None:
    """A header's value decoded as UTF-8 (HTTP servers hand header bytes over as
    Latin-1; clients send UTF-8).

    Raises:
        ServeError: 400 naming the header when its bytes are not UTF-8.
    """
    value = headers.get(name)
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        raise _bad(f"{name}: not valid UTF-8") from None


def session_key_of(body: Mapping, headers: Mapping[str, str],
                   session_headers: tuple[str, ...] = ()) -> tuple[str | None, str]:
    """The session id a request names, and where it named it, first found of:
    the ``X-Session-Id`` header, the ``session_headers`` (``serve.session_headers``,
    in their order), the body's ``session_id``, OpenAI's ``prompt_cache_key``.
    ``(None, FROM_PROMPT)`` when none is there: the session is then found from
    the prompt (``ampd.serve.state.prompt_index``).

    Raises:
        ServeError: 400 naming the header or field whose value is empty, too
            long, not a string, or holds a control, bidi or other invisible
            formatting character.
    """
    for name in (SESSION_HEADER, *session_headers):
        value = header_text(headers, name)
        if value is not None:
            return _checked_id(value, name), name
    for name in (SESSION_FIELD, CACHE_KEY_FIELD):
        value = body.get(name)
        if value is not None:
            return _checked_id(value, name), name
    return None, FROM_PROMPT


def _checked_id(value: object, field: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_SESSION_ID_CHARS:
        raise _bad(f"{field}: must be a non-empty string of at most {MAX_SESSION_ID_CHARS} characters")
    for position, char in enumerate(value):
        kind = _REFUSED_CATEGORIES.get(unicodedata.category(char))
        if kind is not None:
            raise _bad(f"{field}: {kind} characters (CR, LF, NUL, U+202E, ...) are not allowed: U+{ord(char):04X} "
                       f"at position {position}")
    return value


def check_model(body: Mapping, served_models: tuple[str, ...]) -> None:
    """Check that the ``model`` a request names, if any, is one of ``served_models``.

    Raises:
        ServeError: 400 for a ``model`` that is not a string; 404 with OpenAI's
            ``model_not_found`` for a model the cluster does not serve.
    """
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad(f"model: must be a string, got {model!r}")
    if model is not None and model not in served_models:
        raise ServeError(404, f"The model `{model}` does not exist or you do not have access to it.",
                         kind="invalid_request_error", code="model_not_found")


def last_round_of(body: Mapping, headers: Mapping[str, str]) -> bool:
    """Whether the client ends its session with this round: the
    ``X-Session-Last-Round`` header (true/false, 1/0, yes/no) or the body's
    ``session_end`` (a JSON boolean).

    Raises:
        ServeError: 400 for any other value of either.
    """
    flag = body.get("session_end", False)
    if not isinstance(flag, bool):
        raise _bad(f"session_end: must be true or false, got {flag!r}")
    header = (header_text(headers, LAST_ROUND_HEADER) or "").strip().lower()
    if header not in _TRUE + _FALSE:
        raise _bad(f"{LAST_ROUND_HEADER}: must be true or false, got {header!r}")
    return flag or header in _TRUE


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


def max_tokens_of(body: Mapping, default: int = DEFAULT_MAX_TOKENS) -> int:
    """Chat's ``max_completion_tokens``, else ``max_tokens``, else ``default``
    (a null is absent).

    Raises:
        ServeError: 400 unless an integer in [1, MAX_TOKENS].
    """
    value = body.get("max_completion_tokens")
    if value is None:  # OpenAI's newer name first, as vLLM reads them; null is absent
        value = body.get("max_tokens")
    if value is None:
        value = default
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
    """Chat ``messages``: a non-empty list of ``{"role": str, "content": ...}``
    whose content is a string or, as OpenAI's API allows, a list of text parts
    ``{"type": "text", "text": str}``, joined with newlines as vLLM joins them;
    an assistant message with ``tool_calls`` may have a null (or no) content.
    Other fields (``tool_calls``, ``tool_call_id``, ``name``) pass as they are,
    to the chat template. The messages with their content as one string (or None).

    Raises:
        ServeError: 400 naming the first bad message or part.
    """
    if not isinstance(value, list) or not value:
        raise _bad("messages: must be a non-empty list of {role, content} objects")
    checked = []
    for i, message in enumerate(value):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)):
            raise _bad(f"messages[{i}]: must be an object with a string role and a content")
        _check_tool_calls(message.get("tool_calls"), f"messages[{i}].tool_calls")
        content = message.get("content")
        if content is None and message["role"] == "assistant" and message.get("tool_calls"):
            checked.append({**message, "content": None})
            continue
        checked.append({**message, "content": _content_text(content, f"messages[{i}].content")})
    return checked


def _check_tool_calls(calls: object, field: str) -> None:
    """An assistant's ``tool_calls``: a list of ``{"function": {"name": str,
    "arguments": str}}`` objects (OpenAI's shape; a template renders them).

    Raises:
        ServeError: 400 naming the first bad call.
    """
    if calls is None:
        return
    if not isinstance(calls, list):
        raise _bad(f"{field}: must be a list of tool calls")
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(function, dict) and isinstance(function.get("name"), str)
                and isinstance(function.get("arguments", ""), str)):
            raise _bad(f"{field}[{j}]: must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\": str, "
                       "\"arguments\": str}}}}")


def template_fields(body: Mapping) -> dict:
    """The request's fields that a chat template renders (``TEMPLATE_FIELDS``),
    for the ``/tokenize`` call and the engines alike, ``add_generation_prompt``
    always stated (default: true unless ``continue_final_message``); the engine
    checks the values further (a malformed tool schema is its 400, naming the
    field).

    Raises:
        ServeError: 400 unless ``tools`` is a list of objects and the two
            generation flags are booleans, not both true.
    """
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)):
        raise _bad("tools: must be a list of tool objects ({\"type\": \"function\", \"function\": {...}})")
    fields = {name: body[name] for name in TEMPLATE_FIELDS if body.get(name) is not None}
    for name in ("add_generation_prompt", "continue_final_message"):
        if not isinstance(fields.get(name, False), bool):
            raise _bad(f"{name}: must be true or false, got {fields[name]!r}")
    if fields.get("add_generation_prompt") and fields.get("continue_final_message"):
        raise _bad("add_generation_prompt, continue_final_message: not both true (the reply either opens a new "
                   "assistant message or continues the last one)")
    # Stated, not left to each side's default: the engines render what /tokenize rendered.
    fields["add_generation_prompt"] = fields.get("add_generation_prompt", not fields.get("continue_final_message"))
    return fields


def _content_text(content: object, field: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise _bad(f"{field}: must be a string or a non-empty list of text parts")
    texts = []
    for j, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
            raise _bad(f"{field}[{j}]: only text parts {{\"type\": \"text\", \"text\": ...}} are supported")
        texts.append(part["text"])
    return "\n".join(texts)


def round_request(body: Mapping, headers: Mapping[str, str], prompt: tuple[int, ...] = (),
                  session_headers: tuple[str, ...] = (), messages: list[dict] | None = None,
                  template: Mapping | None = None, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> RoundRequest:
    """The round a request asks for, every field checked; its prompt in token
    ids (a text or chat prompt is tokenized once the rest is known good, and
    set with ``dataclasses.replace``); its session id "" when it names none
    (``session_key_of``).

    Args:
        messages: a chat round's checked messages (``check_messages``): the
            round then goes to the engines' chat endpoint with them and the
            client's chat fields; None for a completion.
        template: a chat round's ``template_fields``, sent to the engines as
            they were to ``/tokenize``.
        default_max_tokens: ``max_tokens`` of a request that gives none.

    Raises:
        ServeError: 400 naming the first bad field.
    """
    chat = messages is not None
    own = _OWN_FIELDS["chat" if chat else "completions"]
    params = {k: v for k, v in body.items() if k not in own}
    if chat:
        params.update(template or {}, messages=messages)
    session_id, source = session_key_of(body, headers, session_headers)
    return RoundRequest(session_id or "", prompt, max_tokens_of(body, default_max_tokens), params,
                        last_round_of(body, headers), source, chat=chat)
