"""Capacity searches of run configurations (``ampd.measure.capacity``) stepped
together through a ``PointRunner``: a sweep's and the reproduce grid's
capacities, and the planner's capacity-ranked refinement (``plan_simulation``)."""

from __future__ import annotations

from collections.abc import Sequence

from ampd.config import RunConfig, override
from ampd.core.errors import InputError
from ampd.measure import CAPACITY_ATTAINMENT, TRANSIENT, CapacitySearch, find_capacities
from ampd.run.runner import PointRunner


def search_capacities(bases: Sequence[RunConfig], seeds: Sequence[Sequence[dict]], run: PointRunner,
                      starts_per_s: Sequence[float] | None = None,
                      targets: Sequence[float] | None = None) -> list[CapacitySearch]:
    """The capacity search (``ampd.measure.capacity``) of each base configuration
    (its rate is replaced), all stepping together through ``run``. Each search is
    seeded with rows already run for that configuration (``rate_per_s``,
    ``slo_attainment``, ``verdict``), so it starts from their bracket; one without
    seeds starts at ``starts_per_s`` (default: the base's rate). ``targets``: the
    attainment a rate must keep, per base (default 90 %, AMPD.md section 6). A base's
    ``measure`` section must hold only what the user set (not ``resolve_measure``'s
    output), so every rate gets its own window."""
    searches = []
    for i, (base, rows) in enumerate(zip(bases, seeds, strict=True)):
        search = CapacitySearch(starts_per_s[i] if starts_per_s is not None else base.workload.rate_per_s,
                                targets[i] if targets is not None else CAPACITY_ATTAINMENT)
        for row in rows:
            search.record(row["rate_per_s"], row)
        searches.append(search)
    for rows in seeds:
        _steady(rows)
    find_capacities(searches, lambda batch: _steady(run([override(bases[i], workload={"rate_per_s": r})
                                                         for i, r in batch])))
    return searches


def _steady(rows: Sequence[dict]) -> Sequence[dict]:
    """``rows``, if every one has a steady-state verdict (stable or unstable).

    Raises:
        InputError: a transient row (a session count, or a window too short for a
            verdict): a capacity is a steady-state figure.
    """
    for row in rows:
        if row["verdict"] == TRANSIENT:
            raise InputError(f"capacity needs steady-state runs; the run at {row['rate_per_s']:g} sessions/s is a "
                             f"transient ({row['reason']})")
    return rows
