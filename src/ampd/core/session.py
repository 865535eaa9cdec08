"""Sessions and rounds: the unit of multi-round work (AMPD.md section 1)."""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True, slots=True)
class Session:
    """A multi-round request: arrives at ``arrival_s`` and runs its rounds in order."""

    session_id: str
    arrival_s: float
    rounds: tuple[Round, ...]

    def history_tokens(self, round_index: int) -> int:
        """KV tokens the session holds when round ``round_index`` starts: every
        earlier round's input and output."""
        return sum(r.input_tokens + r.output_tokens for r in self.rounds[:round_index])

    @property
    def total_tokens(self) -> int:
        """KV tokens the session holds after its last round."""
        return self.history_tokens(len(self.rounds))
