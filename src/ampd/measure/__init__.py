"""Measuring a run so its figures do not depend on how long it was (AMPD.md
section 6): warm-up, measurement window and drain in simulated seconds
(``plan``), a stability verdict on every point (``verdict``), and capacity, the
highest rate that keeps the SLO in steady state (``capacity``). Depends on
``core``, ``perf``, ``metrics`` and ``sim`` (its stop rules)."""

from ampd.measure.capacity import CAPACITY_ATTAINMENT, CapacitySearch, find_capacities
from ampd.measure.plan import MeasurePlan, UnloadedLifetimes, measure_plan, slo_lifetime_s
from ampd.measure.verdict import STABLE, TRANSIENT, UNSTABLE, Stability, judge
from ampd.measure.window import measure_window

__all__ = ["CAPACITY_ATTAINMENT", "CapacitySearch", "MeasurePlan", "STABLE", "Stability", "TRANSIENT",
           "UNSTABLE", "UnloadedLifetimes", "find_capacities", "judge", "measure_plan", "measure_window",
           "slo_lifetime_s"]
