"""Exhaustive enumeration of plans: the reference the ILP is tested against, and
the pool ``ampd plan --simulate`` samples from."""

from __future__ import annotations

from ampd.core.errors import InputError
from ampd.planner.plans import Plan
from ampd.planner.tau import TauTable


def enumerate_plans(table: TauTable) -> list[Plan]:
    """Every feasible plan of ``table``, best first (``Plan.order_key``).

    Feasible: both cells usable (not overloaded, decode KV within memory), GPUs within
    ``table.num_gpus``, and the replicas pack onto the servers. Packing is checked with
    ``Deployment.workers`` (first-fit decreasing), independently of the ILP's rows.
    Cost: (prefill cells) x (decode cells) packings; meant for small clusters.
    """
    plans = []
    for p in (c for c in table.prefill if c.usable):
        for d in (c for c in table.decode if c.usable):
            plan = Plan(p, d, "enumerated")
            if plan.num_gpus <= table.num_gpus and _packs(plan, table):
                plans.append(plan)
    return sorted(plans, key=lambda plan: plan.order_key)


def _packs(plan: Plan, table: TauTable) -> bool:
    try:
        plan.deployment.workers(table.num_gpus, table.gpus_per_server)
    except InputError:
        return False
    return True
