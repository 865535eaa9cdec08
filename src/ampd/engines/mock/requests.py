"""The requests a mock engine takes: completion and chat bodies checked as
vLLM's server checks them (a 400 naming the field, in vLLM's error body), a
chat reply planned (``chat.py``), and the ampd keys of ``kv_transfer_params``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi.responses import JSONResponse

from ampd.engines.mock.chat import ChatReplyPlan, ChatRequestError, plan_reply, render_chat, tokenize_text


_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}


class RequestError(Exception):
    """A request the engine refuses: HTTP ``status`` with vLLM's error body;
    ``param`` names the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": _ERROR_TYPES.get(self.status, "Error"),
                 "param": self.param, "code": self.status}
        return JSONResponse({"error": error}, status_code=self.status)


@dataclass(frozen=True)
class CompletionRequest:
    """The fields of ``POST /v1/completions`` (or of a chat request, rendered:
    ``parse_chat_request``) the mock uses.

    Attributes:
        output_ids: the reply's token ids when the request decides them (a
            chat reply, ``chat.plan_reply``); None: ``token_id``'s hashes.
        chat: the chat reply's plan, None for a completion.
    """

    prompt: np.ndarray
    max_tokens: int
    stream: bool
    include_usage: bool
    return_token_ids: bool
    kv_transfer_params: dict[str, Any]
    output_ids: tuple[int, ...] | None = None
    chat: ChatReplyPlan | None = None


def _field(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RequestError(400, f"{name}: expected {kind.__name__}, got {type(value).__name__}", name)
    return value


def _prompt(value: Any, vocab_size: int) -> np.ndarray:
    message = f"prompt: must be a non-empty list of token ids in [0, {vocab_size}) (the mock takes no text)"
    if not isinstance(value, list) or not value:
        raise RequestError(400, message, "prompt")
    try:
        ids = np.asarray(value)
    except (ValueError, OverflowError):
        raise RequestError(400, message, "prompt") from None
    if ids.ndim != 1 or ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= vocab_size:
        raise RequestError(400, message, "prompt")
    return ids.astype(np.int32)


def parse_request(body: Any, model: str, vocab_size: int) -> CompletionRequest:
    """Validate a completion request body.

    Raises:
        RequestError: 404 for another model; 400 naming the field for a text
            prompt, an id out of the vocabulary, or a field of the wrong type or range.
    """
    if not isinstance(body, dict):
        raise RequestError(400, "body: expected a JSON object", "body")
    if body.get("model", model) != model:
        raise RequestError(404, f"The model `{body['model']}` does not exist.", "model")
    prompt = _prompt(body.get("prompt"), vocab_size)
    max_tokens = _field(body, "max_tokens", int, 16)
    if max_tokens < 1:
        raise RequestError(400, f"max_tokens: must be >= 1, got {max_tokens}", "max_tokens")
    stream_options = _field(body, "stream_options", dict, {})
    return CompletionRequest(prompt, max_tokens, _field(body, "stream", bool, False),
                             bool(stream_options.get("include_usage")), _field(body, "return_token_ids", bool, False),
                             _field(body, "kv_transfer_params", dict, {}))


def parse_chat_request(body: Any, model: str, vocab_size: int) -> CompletionRequest:
    """Validate a chat request body and plan its reply (``chat.py``).

    Raises:
        RequestError: 404 for another model; 400 naming the field for missing
            messages, a field of the wrong type or range, a ``tool_choice`` or
            ``response_format`` the mock cannot honour.
    """
    if not isinstance(body, dict):
        raise RequestError(400, "body: expected a JSON object", "body")
    if body.get("model", model) != model:
        raise RequestError(404, f"The model `{body['model']}` does not exist.", "model")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise RequestError(400, "messages: must be a non-empty list", "messages")
    max_tokens = _field(body, "max_completion_tokens", int, _field(body, "max_tokens", int, 16))
    if max_tokens < 1:
        raise RequestError(400, f"max_tokens: must be >= 1, got {max_tokens}", "max_tokens")
    try:
        prompt = tokenize_text(render_chat(body), vocab_size)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a message of another shape
        raise RequestError(400, f"messages: cannot be rendered ({type(exc).__name__}: {exc})", "messages") from None
    try:
        plan = plan_reply(body, prompt, max_tokens)
    except ChatRequestError as exc:
        raise RequestError(400, str(exc), exc.param) from None
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a field of another shape
        raise RequestError(400, f"tools, tool_choice or response_format: malformed ({type(exc).__name__}: {exc})",
                           "tools") from None
    output_ids = tuple(tokenize_text(plan.text, vocab_size))
    stream_options = _field(body, "stream_options", dict, {})
    return CompletionRequest(np.asarray(prompt, dtype=np.int32), len(output_ids), _field(body, "stream", bool, False),
                             bool(stream_options.get("include_usage")), _field(body, "return_token_ids", bool, False),
                             _field(body, "kv_transfer_params", dict, {}), output_ids, plan)


def kv_int_param(params: dict[str, Any], name: str, low: int, high: int | None = None,
                 default: int | None = None) -> int:
    """``kv_transfer_params[name]``, an integer in ``[low, high]`` (``default``
    when absent).

    Raises:
        RequestError: 400 naming ``kv_transfer_params.<name>``.
    """
    value = params.get(name, default)
    if type(value) is not int or value < low or (high is not None and value > high):
        bounds = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise RequestError(400, f"kv_transfer_params.{name}: expected an integer {bounds}, got {value!r}",
                           f"kv_transfer_params.{name}")
    return value
