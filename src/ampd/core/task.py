"""Prefill tasks: one per round, initial or incremental (AMPD.md section 3)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PrefillTask:
    """The prefill of one round.

    Attributes:
        session_id: the session the round belongs to.
        round_index: 0 for the initial prefill, > 0 for incremental prefills.
        hist_tokens: history KV tokens already held by the bound decode worker.
        new_tokens: tokens to prefill on top of the history.
        ready_s: when the round's input became available (session arrival for
            round 0, tool return later): the start of its TTFT, ``T_enq`` in Algorithm 2.
        decode_worker: id of the decode worker the session is bound to.
    """

    session_id: str
    round_index: int
    hist_tokens: int
    new_tokens: int
    ready_s: float
    decode_worker: int

    @property
    def key(self) -> tuple[str, int]:
        """Unique id of the task: (session id, round index)."""
        return (self.session_id, self.round_index)
