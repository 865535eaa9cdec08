"""What a simulated worker reports back to the simulated coordinator."""

from __future__ import annotations

from typing import Protocol

from ampd.core.task import PrefillTask
from ampd.metrics.records import ItlSeries


class RoundSink(Protocol):
    """Receives the milestones of a round from the workers."""

    def first_token(self, task: PrefillTask, prefill_worker: int, local: bool) -> None:
        """The round's prefill is done and its KV is on the decode worker: the first
        output token reaches the user now."""

    def round_done(self, session_id: str, round_index: int, itls: ItlSeries) -> None:
        """The round produced its last output token; ``itls`` are the gaps before
        its tokens after the first."""
