"""Per-round and per-session records every runtime fills in the same way, so the
simulator and serving report identical metrics (AMPD.md section 1)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Iterator, Protocol

import numpy as np


class ItlSeries(Protocol):
    """The gaps before a round's output tokens after the first (seconds), one per
    token: ``len()`` of them, their total ``sum_s``, all of them as ``values()``."""

    def __len__(self) -> int: ...

    @property
    def sum_s(self) -> float: ...

    def values(self) -> np.ndarray: ...


class RecordedItls(list):
    """ITLs observed one by one (serving: tokens as they stream in); a plain list
    of floats (seconds) that also answers ``sum_s`` and ``values()``."""

    @property
    def sum_s(self) -> float:
        return float(sum(self))

    def values(self) -> np.ndarray:
        return np.asarray(self, dtype=float)


class StepLog:
    """The end times (s) of one simulated decode worker's steps, in order.

    A sequence decodes one token in each of a run of consecutive steps (no
    preemption), so its ITLs are differences of this log: kept once per worker
    rather than once per token (an hour of GAIA traffic on 32 GPUs is ~10^7
    tokens but ~10^5 steps per worker)."""

    __slots__ = ("ends_s",)

    def __init__(self) -> None:
        self.ends_s = array("d")

    def __len__(self) -> int:
        return len(self.ends_s)

    def append(self, end_s: float) -> None:
        self.ends_s.append(end_s)


class StepItls:
    """ITLs of a sequence that joined its decode worker at ``join_s`` and
    decoded one token in each of the steps ``start`` to ``stop - 1`` of ``log``:
    the first gap is ``log[start] - join_s``, each later one the gap between two
    consecutive step ends. Valid once those steps have run."""

    __slots__ = ("join_s", "log", "start", "stop")

    def __init__(self, join_s: float, log: StepLog, start: int, stop: int) -> None:
        self.join_s, self.log, self.start, self.stop = join_s, log, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __iter__(self) -> Iterator[float]:
        return iter(self.values().tolist())

    @property
    def sum_s(self) -> float:
        return self.log.ends_s[self.stop - 1] - self.join_s if self.stop > self.start else 0.0

    def values(self) -> np.ndarray:
        ends = np.frombuffer(self.log.ends_s, dtype=float)[self.start:self.stop]
        return np.diff(ends, prepend=self.join_s)


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
    itls_s: ItlSeries = field(default_factory=RecordedItls)
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

    @property
    def itl_count(self) -> int:
        """ITLs over all its rounds."""
        return sum(len(r.itls_s) for r in self.rounds)

    def itl_values(self) -> np.ndarray:
        """Every ITL of every round (seconds), in order."""
        parts = [r.itls_s.values() for r in self.rounds if len(r.itls_s)]
        return np.concatenate(parts) if parts else np.empty(0)
