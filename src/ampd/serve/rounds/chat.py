"""Chat rounds (docs/SERVING.md, "Chat and agents"). A chat round goes to the
engines' own ``/v1/chat/completions`` (prefill and decode alike), so the chat
server does all it does after sampling: tool-call parsing, ``tool_choice``,
structured outputs, reasoning parsing. The coordinator tokenizes the messages
once through an engine's ``/tokenize`` for what its policies count (prompt
length, history, the prompt index), and this file holds the three things it
adds on the way:

- the **prompt check**: each engine returns the prompt it rendered
  (``prompt_token_ids``); one that differs from the coordinator's tokenization
  is an error naming both engines (their templates or flags differ: a
  reservation, a route and a history read counted on other tokens would be
  wrong), never a silent recompute;
- the **stream** as the client sees it: the engine's chunks passed through
  (``delta.content``, ``delta.reasoning``, ``delta.tool_calls``, the finish
  reason, logprobs) under the coordinator's id;
- the **reply** of a non-streaming round, assembled from those chunks the way
  OpenAI's clients assemble a stream (the coordinator always streams from the
  decode engine: it times the first token and every later one).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from ampd.engines.client import CHAT_TEXT_FIELDS, Chunk
from ampd.serve.state.prompt_index import token_bytes

# The body key (popped before sending) by which a queued chat prefill tells its
# dispatcher which prompt the prefill engine must render.
PROMPT_CHECK_KEY = "ampd_prompt_check"


def prompt_digest(token_ids: Sequence[int]) -> str:
    """A 128-bit hash of a prompt's token ids (the same on every replica)."""
    return hashlib.blake2b(token_bytes(token_ids), digest_size=16).hexdigest()


def prompt_check(token_ids: Sequence[int], tokenizer_worker: int) -> dict:
    """What a prefill's dispatcher checks the engine's rendered prompt against
    (``PROMPT_CHECK_KEY``'s value): its length and ``prompt_digest``."""
    return {"tokens": len(token_ids), "digest": prompt_digest(token_ids), "tokenizer_worker": tokenizer_worker}


def prompt_mismatch(check: dict, rendered: Sequence[int] | None, role: str, worker_id: int) -> str | None:
    """Why an engine's rendered prompt is not the one the coordinator counted,
    or None when it is, or when the engine did not say (an engine that returns
    no ``prompt_token_ids`` cannot be checked).

    Args:
        check: ``prompt_check`` of the coordinator's tokenization.
        rendered: the engine's ``prompt_token_ids``.
        role, worker_id: the engine, for the message.
    """
    if rendered is None:
        return None
    if len(rendered) == check["tokens"] and prompt_digest(rendered) == check["digest"]:
        return None
    return (f"{role} engine {worker_id} rendered the chat as {len(rendered)} prompt tokens, other tokens than the "
            f"{check['tokens']} the coordinator counted (tokenized by decode engine {check['tokenizer_worker']}): the "
            "engines' chat templates or tokenizer flags differ; start every engine with the same model, template "
            "and flags")


def stream_choice(chunk: Chunk, first: bool) -> dict:
    """The client's chunk choice for an engine's chat chunk: the engine's delta,
    finish reason and logprobs as they are; the role on the first chunk (the
    engine's own role-only chunk carries no token and is not passed on); the
    chunk's token ids (as completions give them)."""
    choice = {**chunk.choice, "index": 0, "token_ids": list(chunk.token_ids)}
    delta = dict(choice.get("delta") or {})
    if first:
        delta.setdefault("role", "assistant")
    choice["delta"] = delta
    choice.setdefault("finish_reason", None)
    return choice


class ChatReply:
    """A non-streaming chat reply assembled from a round's chunks, as OpenAI's
    clients assemble a stream: text fields concatenated, tool calls merged by
    their ``index`` (id, type and name from the first fragment, arguments
    concatenated), logprobs' content appended, the last finish reason kept."""

    def __init__(self) -> None:
        self._text: dict[str, str] = {}
        self._calls: dict[int, dict] = {}
        self._logprobs: list | None = None
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None

    def add(self, chunk: Chunk) -> None:
        """Take one chunk of the stream."""
        self.token_ids.extend(chunk.token_ids)
        choice = chunk.choice
        delta = choice.get("delta") or {}
        for name in CHAT_TEXT_FIELDS:
            if delta.get(name):
                self._text[name] = self._text.get(name, "") + delta[name]
        for fragment in delta.get("tool_calls") or ():
            self._merge_call(fragment)
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict) and logprobs.get("content"):
            self._logprobs = (self._logprobs or []) + list(logprobs["content"])
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]

    def _merge_call(self, fragment: dict) -> None:
        index = fragment.get("index", len(self._calls))
        call = self._calls.setdefault(index, {"id": None, "type": "function",
                                              "function": {"name": "", "arguments": ""}})
        call["id"] = call["id"] or fragment.get("id")
        call["type"] = fragment.get("type") or call["type"]
        function = fragment.get("function") or {}
        call["function"]["name"] += function.get("name") or ""
        call["function"]["arguments"] += function.get("arguments") or ""

    def choice(self, max_tokens: int) -> dict:
        """The reply's choice: ``message`` (``content`` None where the reply is
        all tool calls, as OpenAI sends it, or all reasoning, as vLLM does; ""
        where it is nothing), ``finish_reason`` (the engine's; "length" or
        "stop" by the token count when it gave none), ``token_ids``."""
        message: dict = {"role": "assistant", "content": self._text.get("content")}
        message.update({name: text for name, text in self._text.items() if name != "content"})
        if self._calls:
            message["tool_calls"] = [self._calls[i] for i in sorted(self._calls)]
        elif message["content"] is None and len(message) == 2:  # no reasoning either
            message["content"] = ""
        finish = self.finish_reason or ("length" if len(self.token_ids) >= max_tokens else "stop")
        return {"index": 0, "message": message, "logprobs": {"content": self._logprobs} if self._logprobs else None,
                "finish_reason": finish, "token_ids": self.token_ids}
