"""When a simulation stops before every session has finished (steady-state
runs: ``ampd.measure.plan``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunLimits:
    """When a simulation stops (``ampd.sim.cluster.SimCluster.run``).

    Attributes:
        measure_from_s, measure_to_s: sessions arriving in ``[from, to)`` are
            measured; the run ends once every one of them has finished...
        stop_by_s: ... or at this time, whichever comes first...
        max_in_system: ... or as soon as more sessions than this are in the
            system (arrived, not finished) at once.
    """

    measure_from_s: float
    measure_to_s: float
    stop_by_s: float
    max_in_system: int

    def measured(self, arrival_s: float) -> bool:
        """Whether a session arriving at ``arrival_s`` is measured."""
        return self.measure_from_s <= arrival_s < self.measure_to_s
