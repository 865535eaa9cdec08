"""The planner co-designed with the router (issue 12, part 3; docs/PLANNER.md, "Co-design"):
each plan's decode side is judged under the local prefills its own prefill side makes the
adaptive router send there, the fixed point between plan and routing.

Under the router model (``queueing.fcfs_ttft_s`` with ``local_above_s``), the local
prefills follow from the prefill cell alone: the tasks whose predicted remote TTFT
exceeds alpha x the TTFT threshold on its k replicas of degree n. A plan (P, D) is
consistent when D's tau is taken with P's local prefills. The best consistent plan is
found by bounding, not by iterating to a point that may cycle:

- a decode side without local prefills is a lower bound on every decode cell's tau
  under any local load (local prefills only take time from decode steps) and on its
  KV need (a slower pace holds more), so the ILP on it, over the prefill cells not yet
  visited, bounds what any of them can reach;
- visit the prefill cell that bound picks: rebuild the decode side with its local
  prefills (one rebuild for every prefill cell with the same local tasks), solve the
  ILP restricted to those prefill cells: their consistent plans;
- stop when the k-th best consistent plan found ranks before the bound
  (``Plan.order_key``): no unvisited prefill cell can do better. Every visit removes
  cells, so it ends; the answer is then the top-k of the co-designed model over every
  prefill cell, each solve being SCIP's proven optimum.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampd.planner.cells import TauCell
from ampd.planner.decode_tau import routed_locals
from ampd.planner.ilp import top_plans
from ampd.planner.plans import Plan
from ampd.planner.tau import TauSides, TauTable


@dataclass(frozen=True)
class CoDesign:
    """What ``co_designed_plans`` found.

    Attributes:
        plans: the best consistent plans, best first (at most ``top_k``).
        visits: per visit, the local share its prefill cells induce (the decode side
            was rebuilt with those local prefills), in visiting order.
        bound: the table the bound was taken on (decode side without local
            prefills, every prefill cell): ``why_infeasible`` reads it when no plan exists.
    """

    plans: tuple[Plan, ...]
    visits: tuple[float, ...]
    bound: TauTable


def co_designed_plans(sides: TauSides, alpha: float, top_k: int, solver: str = "scip") -> CoDesign:
    """The ``top_k`` best consistent plans under adaptive routing with slack ``alpha``
    (module docstring).

    Args:
        sides: the stream (built with no fixed local share) and what the cells need.
        alpha: Algorithm 1's prefill slack (AMPD.md section 3.1; paper default 0.9).
        top_k: plans to return, >= 1.
        solver: as ``ilp.solve``.

    Raises:
        InputError: unknown solver.
        AmpdError: the solver stopped without proving optimality.
    """
    prefill = sides.prefill(alpha * sides.slo.ttft_s)
    bound = sides.table(prefill, sides.decode(routed_locals(sides.stream, ())), 0.0)
    unvisited = {c for c in prefill if c.usable}
    found: list[Plan] = []
    visits: list[float] = []
    while unvisited:
        candidates = tuple(c for c in prefill if c in unvisited)
        bounded = top_plans(_with_prefill(bound, candidates), 1, solver)
        if not bounded or (len(found) == top_k and found[-1].order_key < bounded[0].order_key):
            break
        tasks, share = bounded[0].prefill.local_tasks, bounded[0].prefill.local_share
        group = tuple(c for c in candidates if c.local_tasks == tasks)
        unvisited -= set(group)
        visits.append(share)
        decode = sides.decode(routed_locals(sides.stream, tasks))
        found = sorted(found + top_plans(sides.table(group, decode, share), top_k, solver),
                       key=lambda p: p.order_key)[:top_k]
    return CoDesign(tuple(found), tuple(visits), bound)


def _with_prefill(table: TauTable, prefill: tuple[TauCell, ...]) -> TauTable:
    """``table`` with only the prefill cells ``prefill``."""
    return TauTable(prefill, table.decode, table.slo, table.num_gpus, table.gpus_per_server, table.local_share,
                    table.scope, table.degrees)
