"""Plans judged by the simulator: every plan of a pool run in steady state and ranked
(``ampd plan --simulate``, the agreement benchmark), and the planner's optional
simulation-refined top-k (``[planner] refine_top_k``, ranked by ``refine_by``; docs/PLANNER.md,
"Refined top-k")."""

from __future__ import annotations

from collections.abc import Sequence

from ampd.run.capacity_search import search_capacities
from ampd.config import RunConfig, override
from ampd.core.deployment import Deployment
from ampd.core.errors import InputError
from ampd.run.resolve import rate_for
from ampd.measure import STABLE
from ampd.planner import Plan
from ampd.run.runner import PointRunner


def simulate_plans(config: RunConfig, pool: Sequence[Plan], runner: PointRunner) -> list[dict]:
    """Simulate every plan of ``pool`` (same sessions, system, thresholds and
    measurement as ``config``) with ``runner`` and rank them: stable runs by SLO
    attainment, ties by mean TTFT; every other run (unstable: it does not carry the
    rate; transient: no steady state to compare) shares the rank after them, since its
    figures rank nothing. One row per plan, in pool order, with ``planned_rank``
    (position in ``pool``), ``simulated_rank`` (both from 1) and the run's ``verdict``."""
    configs = [override(config, cluster={"deployment": str(p.deployment)}) for p in pool]
    runs = runner(configs)
    stable = sorted((i for i in range(len(pool)) if runs[i]["verdict"] == STABLE),
                    key=lambda i: (-runs[i]["slo_attainment"], runs[i]["ttft_mean_s"], i))
    simulated_rank = {i: r + 1 for r, i in enumerate(stable)}
    simulated_rank.update({i: len(stable) + 1 for i in range(len(pool)) if i not in simulated_rank})
    return [{"deployment": str(p.deployment), "objective": p.objective, "planned_rank": i + 1,
             "simulated_rank": simulated_rank[i], "slo_attainment": run["slo_attainment"],
             "verdict": run["verdict"], "ttft_mean_s": run["ttft_mean_s"], "ttft_p95_s": run["ttft_p95_s"],
             "itl_p95_s": run["itl_p95_s"], "local_prefill_share": run["local_prefill_share"]}
            for i, (p, run) in enumerate(zip(pool, runs))]


def require_steady_state(config: RunConfig) -> None:
    """Raises ``InputError`` when ``config`` is a run of ``workload.num_sessions``: a
    transient has no capacity to rank plans by."""
    if config.workload.num_sessions is not None:
        raise InputError("planner.refine_by = \"capacity\" needs steady-state runs: leave workload.num_sessions "
                         "(--num-sessions) unset")


def simulate_capacities(config: RunConfig, deployments: Sequence[Deployment], runner: PointRunner) -> list[float]:
    """Each deployment's capacity (sessions/s at the SLO attainment target in steady
    state, ``ampd.measure.capacity``), searched from ``config``'s rate
    (``rate_for``: a trace's own when none is set) with the same sessions, system,
    thresholds and measurement, in order; 0 for one that meets the SLO at
    no rate the search tries (down to 2^-10 of the start).

    Raises:
        InputError: ``config`` is a run of ``workload.num_sessions`` (a transient:
            no capacity); as ``rate_for``; a run of the search that is a transient
            (a measurement window set too short for a verdict).
    """
    require_steady_state(config)
    bases = [override(config, cluster={"deployment": str(d)}) for d in deployments]
    starts = [rate_for(config)] * len(bases)
    return [s.capacity_per_s for s in search_capacities(bases, [[] for _ in bases], runner, starts)]


def refine(config: RunConfig, plans: Sequence[Plan], top_k: int, runner: PointRunner,
           by: str = "attainment") -> list[Plan]:
    """``plans`` (the planner's order) with its first ``top_k`` in simulated order,
    the rest after them unchanged. ``by``:

    - ``attainment``: ``simulate_plans`` at ``config``'s rate (stable runs by
      attainment, ties by mean TTFT; runs that are not stable after them, in the
      planner's order);
    - ``capacity``: ``simulate_capacities``, highest first, ties in the planner's
      order. [our choice] For a deployment chosen for the load it can take: at a
      rate that every candidate carries, attainments near 100 % rank candidates by
      noise, while the capacity is the figure the deployment is judged by.

    Raises:
        InputError: as ``simulate_capacities``; an unknown ``by``.
    """
    head = list(plans[:top_k])
    if by == "capacity":
        capacities = simulate_capacities(config, [p.deployment for p in head], runner)
        order = sorted(range(len(head)), key=lambda i: (-capacities[i], i))
    elif by == "attainment":
        rows = simulate_plans(config, head, runner)
        order = sorted(range(len(head)), key=lambda i: (rows[i]["simulated_rank"], i))
    else:
        raise InputError(f"planner.refine_by: {by!r} is not attainment or capacity")
    return [head[i] for i in order] + list(plans[top_k:])
