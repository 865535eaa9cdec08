"""Capacity: the highest arrival rate whose steady-state SLO attainment is at
least ``CAPACITY_ATTAINMENT`` (AMPD.md section 6; DistServe's goodput), found by
search on the rate with the stability verdict.

Every search starts at a rate of its own (an upper-bound estimate, say), halves
or doubles until it has a rate that meets the SLO and one that does not, then
bisects geometrically until the two are within ``RELATIVE_PRECISION`` of each
other. Attainment falls as the rate grows (more load never helps a session), so
the bracket holds the capacity. The capacity reported is the lower end: a rate
measured to meet the SLO. Should a rate meet the SLO above one that did not
(noise near the edge), the bracket is the lowest rate that missed and the
highest rate below it that met: the capacity is where the system first stops
meeting its SLO. Many searches step together, so each step's runs are
evaluated as one batch (in parallel).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ampd.measure.verdict import STABLE

CAPACITY_ATTAINMENT = 0.9  # AMPD.md section 6: "attainment >= 90 %"
RELATIVE_PRECISION = 0.05  # [our choice] 5 %: finer than the differences between systems worth reporting
MAX_DOUBLINGS = 10  # [our choice] a search gives up 2^10 times away from its start


def meets_slo(row: dict, target: float = CAPACITY_ATTAINMENT) -> bool:
    """Whether a run's row (``slo_attainment``, ``verdict``) keeps the SLO in steady
    state: stable, and at least ``target`` of its sessions attain."""
    return row["verdict"] == STABLE and row["slo_attainment"] >= target


@dataclass
class CapacitySearch:
    """The search of one configuration.

    Attributes:
        start_per_s: the first rate tried.
        target: the attainment a rate must keep (``CAPACITY_ATTAINMENT``).
        rows: every run of the search, in order.
    """

    start_per_s: float
    target: float = CAPACITY_ATTAINMENT
    rows: list[dict] = field(default_factory=list)
    _met: list[float] = field(default_factory=list)
    _missed: list[float] = field(default_factory=list)

    @property
    def high_per_s(self) -> float | None:
        """Lowest rate measured not to meet the SLO (None: none yet)."""
        return min(self._missed, default=None)

    @property
    def low_per_s(self) -> float | None:
        """Highest rate measured to meet the SLO below ``high_per_s`` (None: none yet)."""
        high = self.high_per_s
        return max((r for r in self._met if high is None or r < high), default=None)

    @property
    def capacity_per_s(self) -> float:
        """The capacity found (the bracket's lower end; 0 when no rate tried met the SLO)."""
        return self.low_per_s or 0.0

    @property
    def bounded(self) -> bool:
        """Whether the capacity lies in a measured bracket (False: the search hit
        its limit ``MAX_DOUBLINGS`` away from the start)."""
        return self.low_per_s is not None and self.high_per_s is not None

    def next_rate(self) -> float | None:
        """The next rate to run, or None when the search is over."""
        lo, hi = self.low_per_s, self.high_per_s
        limit = 2.0 ** MAX_DOUBLINGS
        if lo is None and hi is None:
            return self.start_per_s
        if lo is None:
            return hi / 2 if hi > self.start_per_s / limit else None
        if hi is None:
            return lo * 2 if lo < self.start_per_s * limit else None
        return math.sqrt(lo * hi) if hi > lo * (1 + RELATIVE_PRECISION) else None

    def record(self, rate_per_s: float, row: dict) -> None:
        """One run at ``rate_per_s`` finished with ``row``."""
        self.rows.append(row)
        (self._met if meets_slo(row, self.target) else self._missed).append(rate_per_s)


def find_capacities(searches: Sequence[CapacitySearch],
                    evaluate: Callable[[list[tuple[int, float]]], list[dict]]) -> None:
    """Run ``searches`` to their end, stepping together (each may hold runs
    recorded beforehand, e.g. a sweep's points).

    Args:
        evaluate: runs a batch of (search index, rate) pairs and returns one row
            per pair (with ``slo_attainment`` and ``verdict``), in order.
    """
    while True:
        batch = [(i, rate) for i, s in enumerate(searches) if (rate := s.next_rate()) is not None]
        if not batch:
            return
        for (i, rate), row in zip(batch, evaluate(batch)):
            searches[i].record(rate, row)
