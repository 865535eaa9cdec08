"""Per-round and per-session records every runtime fills in the same way, so the
simulator and serving report identical metrics (AMPD.md section 1)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RoundRecord:
    """What happened to one round.

    Attributes:
        session_id, round_index: the round.
        ready_s: when its input became available (start of its TTFT).
        hist_tokens, new_tokens, output_tokens: its sizes.
        first_token_s: when its first output token reached the user.
        done_s: when its last output token was produced.
        local: True when its prefill ran on the bound decode worker.
        prefill_worker: worker id that ran its prefill.
        decode_worker: the bound decode worker.
        itls_s: gap before each output token after the first, seconds (length
            ``output_tokens - 1`` once done).
        recomputed_tokens: history tokens prefilled again because their KV had
            been evicted during the tool call (counted in ``new_tokens``).
    """

    session_id: str
    round_index: int
    ready_s: float
    hist_tokens: int
    new_tokens: int
    output_tokens: int
    decode_worker: int
    first_token_s: float | None = None
    done_s: float | None = None
    local: bool | None = None
    prefill_worker: int | None = None
    itls_s: list[float] = field(default_factory=list)
    recomputed_tokens: int = 0

    @property
    def ttft_s(self) -> float:
        """Time to first token. Raises ValueError if the round has not produced it."""
        if self.first_token_s is None:
            raise ValueError(f"round {self.session_id}/{self.round_index} has no first token yet")
        return self.first_token_s - self.ready_s


@dataclass(slots=True)
class SessionRecord:
    """A session and its rounds; ``done_s`` is set when its last round ends."""

    session_id: str
    arrival_s: float
    num_rounds: int
    rounds: list[RoundRecord] = field(default_factory=list)
    done_s: float | None = None

    @property
    def complete(self) -> bool:
        return self.done_s is not None
