"""The planner applied to a run configuration: its plans, and the ``auto``
deployment every experiment resolves before it runs (issue: "the simulator
experiments use the planner's choice for AMPD unless a deployment is given")."""

from __future__ import annotations

import math

from ampd.config import AUTO_DEPLOYMENT, RunConfig, override
from ampd.core.deployment import Deployment, ReplicaGroup, Role
from ampd.core.errors import InputError
from ampd.core.session import Session
from ampd.run.resolve import batching_for, measure_for, perf_model_for, rate_for, sessions_for, slo_for
from ampd.measure import STABLE, UNSTABLE, CapacitySearch, find_capacities
from ampd.perf.interface import PerfModel
from ampd.run.plan_refine import refine, require_steady_state
from ampd.planner import AMPD_LOCAL_SHARE, Plan, plan_deployments
from ampd.policy.routing import SloThresholds
from ampd.policy.systems import get_system
from ampd.run.runner import PointRunner
from ampd.run.slo_rule import reference_tp


def default_local_share(system: str) -> float:
    """The planner's ``local_share`` for a system: AMPD's ``AMPD_LOCAL_SHARE`` for the
    adaptive-routing family (``System.adaptive``), 0 for the other disaggregated systems.
    [our choice] Dynamo's threshold rules run a load-dependent share locally that
    the planner cannot know in advance; they are planned as plain disaggregation.

    Raises:
        InputError: unknown system.
    """
    return AMPD_LOCAL_SHARE if get_system(system).adaptive else 0.0


def planner_inputs(config: RunConfig) -> tuple[list[Session], PerfModel, SloThresholds, tuple[float, float] | None]:
    """The sessions, performance model, thresholds and measurement window (None for
    a run of ``workload.num_sessions`` sessions) the planner plans a run for: the
    run's own, so the planner reads the steady state the run measures."""
    perf = perf_model_for(config)
    plan = measure_for(config, perf)
    window_s = (plan.warmup_s, plan.warmup_s + plan.window_s) if plan else None
    return sessions_for(config, plan), perf, slo_for(config, perf), window_s


def plan_for(config: RunConfig, top_k: int = 3, local_share: float | None = None,
             solver: str = "scip", runner: PointRunner | None = None) -> list[Plan]:
    """The planner's top-k deployments for a run configuration: its sessions, model,
    GPU, cluster size, thresholds (missing ones derived as for a run), SLO scope and
    decode engines' batching (``batching_for``).

    A system with adaptive routing (``System.adaptive``) is planned co-designed with
    its router (``ampd.planner.codesign``, prefill slack ``policy.alpha``) unless
    ``local_share`` is given; every other system with ``local_share``, default
    ``default_local_share(config.system)``.

    With ``planner.refine_top_k = k > 0``, the planner's best ``max(k, top_k)`` plans are
    found and the first k simulated in steady state (``plan_simulation.refine``, with
    ``runner``, default one on every core) and put in simulated order
    (``planner.refine_by``): by attainment at the run's rate, or by capacity, the
    plans then drawn at the planner's knee (``knee_rate_per_s``); the first
    ``top_k`` come back.

    Raises:
        InputError: as ``ampd.planner.plan_deployments``, or an unknown model, GPU or system.
    """
    refine_k, by = config.planner.refine_top_k, config.planner.refine_by
    source = config
    if refine_k and by == "capacity":
        require_steady_state(config)
        knee_per_s = knee_rate_per_s(config, local_share, solver)
        if knee_per_s > 0:  # else no rate has a plan: the run's own rate says why
            source = override(config, workload={"rate_per_s": knee_per_s})
    plans = _plans(source, max(top_k, refine_k), local_share, solver)
    if refine_k:
        plans = refine(config, plans, refine_k, runner or PointRunner(progress=False), by)
    return plans[:top_k]


def knee_rate_per_s(config: RunConfig, local_share: float | None = None, solver: str = "scip") -> float:
    """The planner's knee: the highest arrival rate, sessions/s, at which its best
    plan keeps both P95s within their thresholds (``Plan.objective`` Z <= 1), to
    ``ampd.measure.capacity.RELATIVE_PRECISION``: a capacity search on the
    planner's own model, from the run's rate (``rate_for``); 0 when no rate it
    tries has such a plan.

    [our choice] Where the capacity-ranked refinement draws its candidates: at a
    rate every plan carries with slack, Z orders plans by their latency there, not
    by the load they can take (docs/PLANNER.md, "Capacity-ranked refinement").

    Raises:
        InputError: as ``rate_for``.
    """
    # The capacity search's own stepping, fed the planner's verdict as a run's row
    # (a rate "meets the SLO" when the best plan's Z <= 1).
    def evaluate(batch: list[tuple[int, float]]) -> list[dict]:
        rows = []
        for _, rate_per_s in batch:
            try:
                z = _plans(override(config, workload={"rate_per_s": rate_per_s}), 1, local_share, solver)[0].objective
            except InputError:  # no feasible plan at this load
                z = math.inf
            rows.append({"verdict": STABLE if z <= 1 else UNSTABLE, "slo_attainment": 1.0 if z <= 1 else 0.0})
        return rows

    search = CapacitySearch(rate_for(config))
    find_capacities([search], evaluate)
    return search.capacity_per_s


def _plans(config: RunConfig, top_k: int, local_share: float | None, solver: str) -> list[Plan]:
    """The ILP's top-k for ``config`` (``plan_for`` without refinement)."""
    co_designed = local_share is None and get_system(config.system).adaptive
    share = default_local_share(config.system) if local_share is None else local_share
    c = config.cluster
    sessions, perf, slo, window_s = planner_inputs(config)
    return plan_deployments(sessions, perf, slo, c.num_gpus, c.gpus_per_server, top_k, share, solver,
                            config.slo.scope.value, window_s, batching_for(config, perf),
                            config.policy.alpha if co_designed else None, config.planner.mixed_degrees)


def colocated_default(config: RunConfig) -> Deployment:
    """``D:<TP=n,DP=N/n>`` at the SLO rule's reference TP: the colocated baselines'
    deployment when none is given."""
    tp = min(reference_tp(perf_model_for(config)), config.cluster.num_gpus)
    return Deployment.of([ReplicaGroup(Role.DECODE, tp, config.cluster.num_gpus // tp)])


def resolve_deployment(config: RunConfig) -> RunConfig:
    """``config`` with ``cluster.deployment = "auto"`` replaced: the planner's best plan
    for disaggregated systems, ``colocated_default`` for colocated ones.

    Raises:
        InputError: as ``plan_for`` (e.g. no feasible plan at this load, with the reason).
    """
    if config.cluster.deployment != AUTO_DEPLOYMENT:
        return config
    if get_system(config.system).colocated:
        deployment = colocated_default(config)
    else:
        deployment = plan_for(config, top_k=1)[0].deployment
    return override(config, cluster={"deployment": str(deployment)})
