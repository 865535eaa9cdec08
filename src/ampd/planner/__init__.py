"""AMPD's offline planner (AMPD.md section 2): how many prefill and decode replicas
to run at which tensor-parallel degree on N GPUs, from tau estimates and an ILP solved
with SCIP (``scipy.optimize.milp`` as a cross-check). Choices: docs/PLANNER.md."""

from ampd.planner.cells import TauCell
from ampd.planner.enumerate import enumerate_plans
from ampd.planner.ilp import SOLVERS, Ilp, build_ilp, solve, top_plans
from ampd.planner.plan import plan_deployments, why_infeasible
from ampd.planner.plans import Plan
from ampd.planner.stream import NominalStream, build_stream
from ampd.planner.tau import AMPD_LOCAL_SHARE, DEGREES, SCOPES, TauTable, estimate_tau, usable_degrees

__all__ = [
    "AMPD_LOCAL_SHARE", "DEGREES", "Ilp", "NominalStream", "Plan", "SCOPES", "SOLVERS", "TauCell", "TauTable", "build_ilp",
    "build_stream", "enumerate_plans", "estimate_tau", "plan_deployments", "solve", "top_plans", "usable_degrees",
    "why_infeasible",
]
