"""``plan_deployments``: AMPD's offline planner end to end (AMPD.md section 2):
tau table, ILP, top-k plans, or a refusal that says why."""

from __future__ import annotations

from collections.abc import Sequence

from ampd.core.deployment import Role
from ampd.core.errors import InputError
from ampd.core.session import Session
from ampd.perf.interface import PerfModel
from ampd.policy.batching import Batching
from ampd.planner.cells import TauCell
from ampd.planner.codesign import co_designed_plans
from ampd.planner.ilp import SOLVERS, top_plans
from ampd.planner.plans import Plan
from ampd.planner.tau import AMPD_LOCAL_SHARE, TauTable, estimate_tau, tau_sides
from ampd.policy.routing import SloThresholds


def plan_deployments(sessions: Sequence[Session], perf: PerfModel, slo: SloThresholds, num_gpus: int,
                     gpus_per_server: int = 8, top_k: int = 3, local_share: float = AMPD_LOCAL_SHARE,
                     solver: str = "scip", scope: str = "mean",
                     window_s: tuple[float, float] | None = None, batching: Batching = Batching(),
                     router_alpha: float | None = None, mixed_degrees: bool = False) -> list[Plan]:
    """The ``top_k`` best deployments of ``num_gpus`` GPUs for ``sessions``, best first.

    Each plan runs k prefill replicas of one degree and k' decode replicas of one
    degree (degrees 1, 2, 4, 8 within a server; with ``mixed_degrees``, either side
    may add replicas of a smaller degree) and minimises Z, the worse of the
    normalised P95 TTFT (prefill side) and P95 ITL (decode side); see ``ilp`` for the
    ILP and ``Plan.order_key`` for ties. At least one prefill replica: decode-only
    deployments are colocated serving, outside the planner's space. Fewer than
    ``top_k`` plans come back when fewer are feasible.

    Args:
        sessions: the workload with its arrival times; its rate is the planned load.
        perf: cost functions of the model on the GPU type.
        slo: TTFT and ITL thresholds, seconds.
        num_gpus: the budget N; ``gpus_per_server``: a replica never spans servers.
        top_k: plans to return, >= 1.
        local_share: share of prefills run locally (``AMPD_LOCAL_SHARE`` = 0.2 for AMPD, 0
            for plain PD disaggregation).
        solver: ``"scip"`` (default) or ``"milp"`` (scipy, the cross-check).
        scope: what the P95s are over (``tau.SCOPES``): ``mean`` (default, sessions' mean
            TTFT and ITL) or ``strict`` (rounds' TTFT and tokens' ITL, the paper's).
        window_s: the measurement window of a steady-state stream of sessions (the load
            is read in it, the P95s are over its sessions); None: the whole stream.
        batching: how the decode replicas' engine runs a local prefill (a pause, the
            paper's default, or chunks mixed into decode steps).
        router_alpha: None (default): ``local_share`` of the prefills run locally,
            whatever the plan. A number: co-designed with adaptive routing of that
            prefill slack (``codesign``): each plan's decode side carries the local
            prefills its prefill side makes the router send there; ``local_share`` is
            then unused.
        mixed_degrees: also plans whose sides mix two degrees (``decode_tau``, ``prefill_tau``,
            "Mixed degrees": k replicas of degree b beside j < b / a of degree a).

    Raises:
        InputError: ``top_k`` < 1, an unknown solver or scope; the model fits at no degree; too
            few GPUs for one prefill and one decode replica; no feasible plan (the message
            names the binding constraint: overload, memory or the GPU budget; co-designed:
            also when every plan's decode side fails under its local prefills).
        AmpdError: the solver stopped without proving optimality.
    """
    if top_k < 1:
        raise InputError(f"top_k must be >= 1, got {top_k}")
    if solver not in SOLVERS:
        raise InputError(f"unknown solver {solver!r}; known: {', '.join(SOLVERS)}")
    if router_alpha is None:
        table = estimate_tau(sessions, perf, slo, num_gpus, gpus_per_server, local_share, scope, window_s=window_s,
                             batching=batching, mixed_degrees=mixed_degrees)
        plans = top_plans(table, top_k, solver)
        if not plans:
            raise InputError(why_infeasible(table))
        return plans
    sides = tau_sides(sessions, perf, slo, num_gpus, gpus_per_server, 0.0, scope, window_s=window_s,
                      batching=batching, mixed_degrees=mixed_degrees)
    design = co_designed_plans(sides, router_alpha, top_k, solver)
    if not design.plans:
        bound = top_plans(design.bound, 1, solver)
        raise InputError(f"no feasible plan on {num_gpus} GPUs once each decode side carries the local prefills "
                         f"its prefill side induces under adaptive routing" if bound else why_infeasible(design.bound))
    return list(design.plans)


def why_infeasible(table: TauTable) -> str:
    """Which constraint leaves ``table`` without a plan: overload of a role, decode KV
    memory, or the GPU budget (with packing) when each role alone would fit."""
    head = f"no feasible plan on {table.num_gpus} GPUs"
    prefill = [c for c in table.prefill if c.usable]
    decode = [c for c in table.decode if c.usable]
    if not prefill:
        return f"{head}: overload: {_worst(table.prefill)}"
    if not decode and any(not c.overloaded for c in table.decode):
        tightest = min((c for c in table.decode if not c.overloaded), key=lambda c: c.kv_tokens / c.kv_capacity_tokens)
        return (f"{head}: memory: a decode replica must hold the KV of its share of resident sessions; the best, "
                f"{tightest.label}, needs {tightest.kv_tokens} tokens per replica and holds {tightest.kv_capacity_tokens}")
    if not decode:
        return f"{head}: overload: {_worst(table.decode)}"
    need = min(c.gpus for c in prefill) + min(c.gpus for c in decode)
    return (f"{head}: GPU budget: the smallest prefill and decode sets that are neither overloaded nor over memory "
            f"need {need} GPUs together, or do not pack onto servers of {table.gpus_per_server}")


def _worst(cells: tuple[TauCell, ...]) -> str:
    """The overload of the largest set of the role (the most replicas that fit)."""
    largest = max(cells, key=lambda c: (c.gpus, c.tp))
    role = "prefill" if largest.role is Role.PREFILL else "decode"
    return f"every {role} choice is overloaded, even {largest.label}: {largest.reason}"
