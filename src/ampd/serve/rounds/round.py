"""What a coordinator knows about one round in flight: the client's request,
the prefill task, the decisions taken for it, and what the client is told."""

from __future__ import annotations

from dataclasses import dataclass, field

from ampd.core.errors import AmpdError
from ampd.core.task import PrefillTask
from ampd.serve.state.store import SessionState


class ServeError(AmpdError):
    """A round the coordinator cannot serve; ``status`` is the HTTP status to
    answer, ``retry_after_s`` (seconds) the ``Retry-After`` it suggests, if any;
    ``kind`` and ``code`` the error body's ``type`` and ``code`` where OpenAI's
    own differ from the defaults (``app.error_response``). The message is the
    client's: it names no engine URL."""

    def __init__(self, status: int, message: str, retry_after_s: float | None = None, kind: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.retry_after_s, self.kind, self.code = status, retry_after_s, kind, code


FROM_PROMPT = "prompt"  # ``RoundRequest.session_source`` of a session found from the prompt (prompt_index.py)


@dataclass(frozen=True, slots=True)
class RoundRequest:
    """One client request = one round of a session.

    Attributes:
        session_id: the session's id ("" until found from the prompt).
        prompt: the full prompt as token ids (history + new input).
        max_tokens: output tokens to generate.
        params: the client's other sampling fields, passed to the engines.
        last_round: the client says the session ends with this round (its KV
            reservation is then released).
        session_source: where the id came from: the header or body field that
            named it (``requests.session_key_of``), or ``FROM_PROMPT``.
        matched_tokens: tokens of the session's history the prompt is verified
            to start with (its decode engine may hold more: a chat client
            re-renders the output it was sent; an edited turn); None where
            nothing of the session is filed (the prompt is then taken to
            extend all the engine holds).
        branch_round: for a prompt that extends an earlier round of its session
            than the latest (``HistoryMatch.diverged``), that round: the
            session's index entries of later rounds are dropped when this round
            is filed, since its decode engine then holds this branch, not theirs.
        chat: the round goes to the engines' ``/v1/chat/completions`` with
            ``params`` (its messages included), which render the same prompt
            as ``prompt`` (checked); else to ``/v1/completions`` with ``prompt``.
        tokenizer_worker: the engine whose ``/tokenize`` gave ``prompt`` from
            text or messages (named when an engine renders another prompt); -1
            for token ids the client sent.
    """

    session_id: str
    prompt: tuple[int, ...]
    max_tokens: int
    params: dict = field(default_factory=dict)
    last_round: bool = False
    session_source: str = "X-Session-Id"
    matched_tokens: int | None = None
    branch_round: int | None = None
    chat: bool = False
    tokenizer_worker: int = -1


@dataclass(slots=True)
class RoundTrace:
    """Where a round ran and what happened, model seconds (the response headers
    and the tests read it).

    Attributes:
        decode_worker: the worker streaming its output (after any rebind).
        prefill_worker: the worker whose prefill produced its KV.
        local: True when prefilled on the decode worker.
        fallback: why a remote prefill was replaced by a local recompute, or None.
        rebinds: times its session moved to another decode worker during it.
        hist_tokens: prompt tokens its decode worker held when it was routed.
        routed_s: when its prefill was routed (binding, state read and decision done).
        kv_ready_s: remote: when the prefill's outcome reached this replica.
        remote_phases_s: remote: the dispatcher's timings of its prefill
            (``round_phases.DISPATCH_PHASES``), model seconds.
    """

    session_id: str
    round_index: int = -1
    hist_tokens: int = 0
    ready_s: float = 0.0
    decode_worker: int = -1
    prefill_worker: int = -1
    local: bool = True
    fallback: str | None = None
    rebinds: int = 0
    first_token_s: float | None = None
    last_token_s: float | None = None
    num_tokens: int = 0
    degraded: bool = False
    routed_s: float | None = None
    kv_ready_s: float | None = None
    remote_phases_s: dict[str, float] = field(default_factory=dict)


def engine_body(request: RoundRequest, model: str, prompt: tuple[int, ...], max_tokens: int, stream: bool) -> dict:
    """The request an engine gets for a round (docs/SERVING.md, "Engine API"):
    the client's other fields, then the coordinator's own; a chat round's is a
    chat request (its messages in ``request.params``; ``prompt`` unused: the
    engine renders it), a completion's carries ``prompt`` as token ids. Engines
    return token ids (a chat engine also the prompt's, ``prompt_token_ids``)."""
    body = {**request.params, "model": model, "max_tokens": max_tokens, "stream": stream, "return_token_ids": True}
    if not request.chat:
        body["prompt"] = list(prompt)
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


@dataclass(slots=True)
class LiveRound:
    """A round between routing and its last token.

    Attributes:
        request, task, trace: as named.
        state: the session's binding once this round started.
        kv_params: the prefill engine's ``kv_transfer_params`` to hand to the
            decode engine; None for a local prefill.
        usage: the engine's last usage report.
    """

    request: RoundRequest
    task: PrefillTask
    trace: RoundTrace
    state: SessionState
    kv_params: dict | None = None
    usage: dict | None = None
