"""The mock engine's chat server: what a vLLM chat endpoint started with a tool
parser and a structured-outputs backend does, in the mock's token space
(docs/SERVING.md, "Chat and agents"), so agent frameworks run their tool loops
on the mock cluster.

**Template.** A chat renders as text, one token a byte (``tokenize_text``): a
``tools: <JSON>`` line when the request has tools, then one ``<role>: <content>``
line per message (an assistant's tool calls rendered after its content as
``<tool_call>{"name": <name>, "arguments": <arguments>}</tool_call>``, the
arguments string as the client sent it back), then ``assistant: `` for the reply.

**Replies.** Deterministic, and rendered back by the template to exactly the
ids generated, so a session's history is a prefix of its next prompt (as a real
model's mostly is):

- a tool call when ``tool_choice`` names a function or is ``"required"``, or is
  ``"auto"`` (the default with tools) and the conversation holds fewer than
  ``MOCK_TOOL_ROUNDS`` tool results [our choice: an agent loop of that many
  tool rounds, then an answer]: tool ``k mod len(tools)`` after k results; its
  arguments an instance of the tool's ``parameters`` schema (``schema_instance``),
  parsed into ``tool_calls`` as vLLM's parsers do, streamed as OpenAI's
  ``delta.tool_calls`` (the name, then the arguments a character a token);
  finish reason ``"tool_calls"`` (``"stop"`` for a named function, as vLLM);
- an instance of the schema for ``response_format`` ``json_schema`` (``{}`` for
  ``json_object``), finish reason ``"stop"``;
- else ``max_tokens`` letters and spaces (the mock models no end-of-sequence
  token, as ``ignore_eos``), finish reason ``"length"``.

A structured reply longer than ``max_tokens`` is cut there and comes back as
content with finish reason ``"length"`` (vLLM's parsers leave an unfinished call
as text). Reasoning output is not emulated.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ampd.core.session import MAX_TOKENS

MOCK_TOOL_ROUNDS = 4
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
GENERATION_PROMPT = "assistant: "
SPECIAL_IDS = 3  # <unk>, <s>, </s>: the byte tokens start after them
_TEXT_CHARS = "abcdefghijklmnopqrstuvwxyz "


class ChatRequestError(ValueError):
    """A chat request the mock refuses (400); ``param`` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def tokenize_text(text: str, vocab_size: int) -> list[int]:
    """The mock's tokenizer: each UTF-8 byte one id (shifted past the special
    ids, folded into the vocabulary)."""
    return [SPECIAL_IDS + b % max(1, vocab_size - SPECIAL_IDS) for b in text.encode()]


def render_call(name: str, arguments: str) -> str:
    """A tool call as the template renders it and the mock generates it."""
    return f'{TOOL_CALL_OPEN}{{"name": {json.dumps(name)}, "arguments": {arguments}}}{TOOL_CALL_CLOSE}'


def _content(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):  # text parts, joined as vLLM joins them
        content = "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    text = "" if content is None else str(content)
    for call in message.get("tool_calls") or ():
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        text += render_call(str(function.get("name", "")), str(function.get("arguments", "")))
    return text


def render_chat(body: dict) -> str:
    """The prompt text of a chat request (``messages``, ``tools``,
    ``add_generation_prompt``; see the module docstring)."""
    text = f"tools: {json.dumps(body['tools'])}\n" if body.get("tools") else ""
    text += "".join(f"{m.get('role')}: {_content(m)}\n" for m in body["messages"] if isinstance(m, dict))
    return text + (GENERATION_PROMPT if body.get("add_generation_prompt", True) else "")


def tokenize_body(body: Any, vocab_size: int) -> dict[str, Any]:
    """The mock's ``POST /tokenize`` (vLLM's shape): a string ``prompt``, or chat
    ``messages`` rendered by ``render_chat``.

    Raises:
        ValueError: neither a string ``prompt`` nor a list of ``messages``.
    """
    if isinstance(body, dict) and isinstance(body.get("prompt"), str):
        text = body["prompt"]
    elif isinstance(body, dict) and isinstance(body.get("messages"), list):
        text = render_chat(body)
    else:
        raise ValueError("expected a string 'prompt' or a list of 'messages'")
    tokens = tokenize_text(text, vocab_size)
    return {"tokens": tokens, "count": len(tokens), "max_model_len": MAX_TOKENS}


MAX_SCHEMA_DEPTH = 32  # [our choice] deeper than tool schemas nest; stops a $ref loop
# [our choice] Above this depth an array gets one item and an object every property; deeper,
# only minItems items and the required properties, so that a recursive schema ends.
FULL_DEPTH = 4


def schema_instance(schema: Any, root: Any = None, depth: int = 0) -> Any:
    """A deterministic value that satisfies a JSON schema of the kinds tool
    parameters and structured outputs use: ``$ref`` to ``#/$defs`` or
    ``#/definitions``, ``const``, ``enum`` (its first value), ``anyOf`` /
    ``oneOf`` (the first branch), objects (every property; below ``FULL_DEPTH``
    levels the required ones), arrays (``minItems`` items; one where it allows
    none, above ``FULL_DEPTH``: a recursive schema ends), strings (``minLength``, at most ``maxLength``),
    integers and numbers (``minimum``, else just above ``exclusiveMinimum``,
    else 1; at most ``maximum``), booleans (true), null.

    Raises:
        ChatRequestError: a ``$ref`` that does not resolve in the schema, a
            schema nested deeper than ``MAX_SCHEMA_DEPTH`` (a reference loop), or
            a keyword of the wrong type.
    """
    root = schema if root is None else root
    if depth > MAX_SCHEMA_DEPTH:
        raise ChatRequestError(f"schema: nested deeper than {MAX_SCHEMA_DEPTH} levels (a $ref loop?)", "tools")
    if not isinstance(schema, dict):
        return {}
    try:
        return _instance(schema, root, depth)
    except ChatRequestError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise ChatRequestError(f"schema: a keyword of the wrong type ({type(exc).__name__}: {exc})", "tools") from None


def _instance(schema: dict, root: Any, depth: int) -> Any:
    below = depth + 1
    if "$ref" in schema:
        return schema_instance(_resolve(schema["$ref"], root), root, below)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return schema_instance(schema[key][0], root, below)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None:
        kind = "object" if "properties" in schema else "string"
    if kind == "object":
        required = set(schema.get("required") or ())
        return {name: schema_instance(sub, root, below) for name, sub in (schema.get("properties") or {}).items()
                if depth < FULL_DEPTH or name in required}
    if kind == "array":
        count = int(schema.get("minItems", 1 if depth < FULL_DEPTH else 0))
        return [schema_instance(schema.get("items", {}), root, below)] * count if count > 0 else []
    if kind == "string":
        low, high = int(schema.get("minLength", 0)), schema.get("maxLength")
        text = "v" * max(low, 3)
        return text if high is None else text[:max(low, int(high))]
    if kind in ("integer", "number"):
        value = schema["minimum"] if "minimum" in schema else schema.get("exclusiveMinimum", 0) + 1
        value = min(value, schema.get("maximum", value))
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return True
    return None


def _resolve(ref: str, root: Any) -> Any:
    node = root
    if ref == "#":
        return root
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise ChatRequestError(f"$ref {ref!r}: only local references (#/...) are supported", "tools")
    for part in ref[2:].split("/"):
        if not isinstance(node, dict) or part not in node:
            raise ChatRequestError(f"$ref {ref!r} does not resolve in the schema", "tools")
        node = node[part]
    return node


@dataclass
class ChatReplyPlan:
    """What the mock answers to one chat request.

    Attributes:
        text: the reply as generated (one token a character: ASCII only).
        deltas: the ``delta`` of each token's stream chunk.
        message: the non-streaming reply's ``message``.
        finish_reason: OpenAI's.
    """

    text: str
    deltas: list[dict] = field(default_factory=list)
    message: dict = field(default_factory=dict)
    finish_reason: str = "length"


def _tool_choice(body: dict) -> tuple[dict | None, bool]:
    """The tool to call (None: no call), and whether it was named."""
    tools = [t for t in body.get("tools") or () if isinstance(t, dict)]
    choice = body.get("tool_choice")
    if choice is None:  # absent or null: OpenAI's default
        choice = "auto" if tools else "none"
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        named = next((t for t in tools if (t.get("function") or {}).get("name") == name), None)
        if named is None:
            raise ChatRequestError(f"tool_choice: no tool named {name!r} in tools", "tool_choice")
        return named, True
    if choice not in ("auto", "none", "required"):
        raise ChatRequestError(f"tool_choice: expected 'auto', 'none', 'required' or a named function, got "
                               f"{choice!r}", "tool_choice")
    if choice == "required" and not tools:
        raise ChatRequestError("tool_choice: 'required' needs tools", "tool_choice")
    results = sum(1 for m in body["messages"] if isinstance(m, dict) and m.get("role") == "tool")
    if choice == "none" or not tools or (choice == "auto" and results >= MOCK_TOOL_ROUNDS):
        return None, False
    return tools[results % len(tools)], False


def plan_reply(body: dict, prompt: Sequence[int], max_tokens: int) -> ChatReplyPlan:
    """The reply to a chat request (see the module docstring): a function of the
    request alone, as greedy decoding is, so the same request gets the same
    reply through any path and on any engine.

    Args:
        body: the request (``messages`` checked to be a list).
        prompt: its rendered token ids (the call id and the text's letters are
            drawn from them).
        max_tokens: its budget.

    Raises:
        ChatRequestError: a ``tool_choice`` or ``response_format`` the mock cannot honour.
    """
    key = hashlib.blake2b(b"".join(t.to_bytes(4, "little") for t in prompt), digest_size=16).digest()
    tool, named = _tool_choice(body)
    if tool is not None:
        function = tool.get("function") or {}
        name = str(function.get("name", ""))
        arguments = json.dumps(schema_instance(function.get("parameters") or {"type": "object"}))
        call_id = "call_" + hashlib.blake2b(key, digest_size=8).hexdigest()
        plan = _call_plan(name, arguments, call_id, "stop" if named else "tool_calls")
    else:
        plan = _structured_plan(body.get("response_format"), key, max_tokens)
    if len(plan.text) > max_tokens:  # cut: what was generated is text, as a parser leaves an unfinished call
        text = plan.text[:max_tokens]
        return ChatReplyPlan(text, [{"content": c} for c in text], {"role": "assistant", "content": text}, "length")
    return plan


def _call_plan(name: str, arguments: str, call_id: str, finish_reason: str) -> ChatReplyPlan:
    text = render_call(name, arguments)
    args_start = text.index('"arguments": ') + len('"arguments": ')
    args_end = args_start + len(arguments)
    deltas: list[dict] = []
    for i, char in enumerate(text):
        if i == args_start - 1:  # the name is out: the call opens
            deltas.append({"tool_calls": [{"index": 0, "id": call_id, "type": "function",
                                           "function": {"name": name, "arguments": ""}}]})
        elif args_start <= i < args_end:
            deltas.append({"tool_calls": [{"index": 0, "function": {"arguments": char}}]})
        else:
            deltas.append({})
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return ChatReplyPlan(text, deltas, {"role": "assistant", "content": None, "tool_calls": [call]}, finish_reason)


def _structured_plan(response_format: Any, key: bytes, max_tokens: int) -> ChatReplyPlan:
    kind = response_format.get("type", "text") if isinstance(response_format, dict) else "text"
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise ChatRequestError("response_format.json_schema.schema: expected an object",
                                   "response_format.json_schema.schema")
        text, finish = json.dumps(schema_instance(schema)), "stop"
    elif kind == "json_object":
        text, finish = "{}", "stop"
    elif kind == "text":
        stream = hashlib.shake_256(key).digest(max_tokens)
        text, finish = "".join(_TEXT_CHARS[b % len(_TEXT_CHARS)] for b in stream), "length"
    else:
        raise ChatRequestError(f"response_format.type: expected 'text', 'json_object' or 'json_schema', got "
                               f"{kind!r}", "response_format.type")
    return ChatReplyPlan(text, [{"content": c} for c in text], {"role": "assistant", "content": text}, finish)
