"""Sessions and rounds: the unit of multi-round work (AMPD.md section 1)."""

from __future__ import annotations

from dataclasses import dataclass

from ampd.core.errors import InputError

# [our choice] Sanity bounds on what one session may ask for: no model today reads 10M tokens in
# one round, and no trace spans 30 years. They keep absurd inputs (1e30 tokens, tool_s = 1e308)
# from overflowing the cost model or the clock instead of failing with a message.
MAX_TOKENS = 10_000_000
MAX_TIME_S = 1e9


@dataclass(frozen=True, slots=True)
class Round:
    """One round of a session.

    Attributes:
        input_tokens: new input of this round (round 0: the prompt; later rounds:
            the tool output). Prefilled on top of the session's history.
        output_tokens: tokens the model generates in this round (>= 1; the first
            one comes out of the prefill).
        tool_s: environment latency after this round (tool call, retrieval), in
            seconds; ignored after the last round.
    """

    input_tokens: int
    output_tokens: int
    tool_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("input_tokens", "output_tokens"):
            value = getattr(self, name)
            if not (isinstance(value, int) and 1 <= value <= MAX_TOKENS):
                raise InputError(f"round {name}: must be an integer in [1, {MAX_TOKENS}], got {value!r}")
        if not (isinstance(self.tool_s, (int, float)) and 0 <= self.tool_s <= MAX_TIME_S):
            raise InputError(f"round tool_s: must be in [0, {MAX_TIME_S:g}] s, got {self.tool_s!r}")


@dataclass(frozen=True, slots=True)
class Session:
    """A multi-round request: arrives at ``arrival_s`` and runs its rounds in order."""

    session_id: str
    arrival_s: float
    rounds: tuple[Round, ...]

    def __post_init__(self) -> None:
        if not (isinstance(self.session_id, str) and self.session_id.strip()):
            raise InputError(f"session_id: must be a non-empty string, got {self.session_id!r}")
        if not (isinstance(self.arrival_s, (int, float)) and 0 <= self.arrival_s <= MAX_TIME_S):
            raise InputError(f"session {self.session_id}: arrival_s must be in [0, {MAX_TIME_S:g}] s, "
                             f"got {self.arrival_s!r}")
        if not self.rounds or not all(isinstance(r, Round) for r in self.rounds):
            raise InputError(f"session {self.session_id}: rounds must be a non-empty sequence of Round")

    def history_tokens(self, round_index: int) -> int:
        """KV tokens the session holds when round ``round_index`` starts: every
        earlier round's input and output."""
        return sum(r.input_tokens + r.output_tokens for r in self.rounds[:round_index])

    @property
    def total_tokens(self) -> int:
        """KV tokens the session holds after its last round."""
        return self.history_tokens(len(self.rounds))
