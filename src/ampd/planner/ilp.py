"""The planner's ILP (AMPD.md section 2, with the linearisation marked [our choice]
there), solved by SCIP or, as an independent cross-check, ``scipy.optimize.milp``.

Variables: one binary ``z(c)`` per cell c = (role, n, k) of the tau table that is not
overloaded (``z = 1``: the role runs k replicas of degree n; the paper's
``x(n) = sum_k k z(P, n, k)``, ``y(n) = sum_k k z(D, n, k)``), and ``R >= 0``.
Rows:

- one degree per role: ``sum_{n,k} z(role, n, k) = 1`` (docs/PLANNER.md, "Mixed degrees");
- the min-max objective: ``R >= sum rank(c) z(c)`` over each role's cells;
- GPU budget: ``sum n k z(c) <= N``;
- packing on servers: for each degree s, the GPUs of replicas of degree >= s fit in the
  slots of s GPUs the servers have (degrees are powers of two, so this is exact; a
  cell with mixed degrees counts each group's GPUs at its own degree);
- memory: for each decode degree n, ``sum_k kv(n, k) z(D, n, k) <= capacity(n)``: a
  replica holds the weights plus the P95 KV of its share of resident sessions (a
  mixed cell is in the rows of its main degree, its KV in that replica's terms).

Objective: ``minimise (U + 1) R + sum rank(c) z(c)``, U the number of cells. ``rank`` is
the position of a cell in ``TauCell.order_key`` (tau normalised by its SLO threshold,
then fewer GPUs, ...). Ranks keep the order of the taus, and max commutes with an
order-preserving map, so minimising R is minimising Z = max(tau_pre, tau_dec); the
second term breaks ties by the other role's tau. All coefficients are integers and two
plans never share an objective, so "optimal" means the best plan of ``Plan.order_key``,
with no tolerance involved. Top-k: re-solve with a no-good cut
``z(p) + z(d) <= 1`` on each plan found.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pyscipopt

from ampd.core.deployment import Role
from ampd.core.errors import AmpdError, InputError
from ampd.planner.cells import TauCell
from ampd.planner.plans import Plan
from ampd.planner.tau import TauTable

SOLVERS = ("scip", "milp")
"""Solvers behind ``solve``: SCIP (default, via pyscipopt) and scipy's HiGHS-based ``milp``."""


@dataclass(frozen=True)
class Ilp:
    """``minimise objective . x`` subject to ``lower <= matrix x <= upper``, with
    ``x = (z(cells[0]), ..., z(cells[-1]), R)``, z binary and R >= 0 continuous.

    Attributes:
        cells: the cells with a binary, prefill cells first.
        objective: shape (len(cells) + 1,).
        matrix: shape (rows, len(cells) + 1).
        lower, upper: shape (rows,); -inf / inf where a side is open.
    """

    cells: tuple[TauCell, ...]
    objective: np.ndarray
    matrix: np.ndarray
    lower: np.ndarray
    upper: np.ndarray

    def with_cut(self, chosen: tuple[int, ...]) -> "Ilp":
        """The same ILP with a no-good cut excluding the plan whose binaries are ``chosen``."""
        row = np.zeros(self.matrix.shape[1])
        row[list(chosen)] = 1.0
        return replace(self, matrix=np.vstack([self.matrix, row]), lower=np.append(self.lower, -np.inf),
                       upper=np.append(self.upper, len(chosen) - 1.0))


def build_ilp(table: TauTable) -> Ilp:
    """The ILP of the module docstring for ``table``."""
    cells = tuple(c for c in table.cells if not c.overloaded)
    by_order = sorted(range(len(cells)), key=lambda i: cells[i].order_key)
    rank = np.zeros(len(cells) + 1)
    rank[by_order] = np.arange(1, len(cells) + 1)
    rows = _role_rows(cells, rank) + _capacity_rows(cells, table)
    matrix = np.array([r[0] for r in rows]).reshape(len(rows), len(cells) + 1)
    objective = rank.copy()
    objective[-1] = len(cells) + 1
    return Ilp(cells, objective, matrix, np.array([r[1] for r in rows]), np.array([r[2] for r in rows]))


def _row(cells: tuple[TauCell, ...], coefficient, keep) -> np.ndarray:
    return np.array([float(coefficient(c)) if keep(c) else 0.0 for c in cells] + [0.0])


def _role_rows(cells: tuple[TauCell, ...], rank: np.ndarray) -> list[tuple[np.ndarray, float, float]]:
    rows = []
    for role in (Role.PREFILL, Role.DECODE):
        mine = _row(cells, lambda c: 1, lambda c: c.role is role)
        rows.append((mine, 1.0, 1.0))
        below_r = mine * rank
        below_r[-1] = -1.0
        rows.append((below_r, -np.inf, 0.0))
    return rows


def _capacity_rows(cells: tuple[TauCell, ...], table: TauTable) -> list[tuple[np.ndarray, float, float]]:
    n, per_server = table.num_gpus, table.gpus_per_server
    rows = [(_row(cells, lambda c: c.gpus, lambda c: True), -np.inf, float(n))]
    for s in table.degrees:
        slots = (n // per_server) * (per_server // s) * s + (n % per_server) // s * s
        rows.append((_row(cells, lambda c: c.gpus_from_degree(s), lambda c: True), -np.inf, float(slots)))
    for tp in table.degrees:
        decode = [c for c in cells if c.role is Role.DECODE and c.tp == tp]
        if decode:
            rows.append((_row(cells, lambda c: c.kv_tokens, lambda c: c.role is Role.DECODE and c.tp == tp),
                         -np.inf, float(decode[0].kv_capacity_tokens)))
    return rows


def solve(ilp: Ilp, solver: str = "scip") -> tuple[tuple[int, ...], str]:
    """Solve ``ilp``; returns (indices of the binaries set to 1, status). Status is
    ``"optimal"`` (proven by the solver), ``"infeasible"``, or the solver's own word.

    Raises:
        InputError: unknown ``solver`` (known: ``SOLVERS``).
    """
    if solver == "scip":
        return _solve_scip(ilp)
    if solver == "milp":
        return _solve_milp(ilp)
    raise InputError(f"unknown solver {solver!r}; known: {', '.join(SOLVERS)}")


def _solve_scip(ilp: Ilp) -> tuple[tuple[int, ...], str]:
    model = pyscipopt.Model()
    model.hideOutput()
    # Presolving a few hundred binaries in a dozen rows took 3/4 of each solve (125 ms of
    # 160 at 256 GPUs, issue 37); the search still proves the optimum, and it is unique
    # (module docstring: no two plans share an objective), so the plans are the same.
    model.setPresolve(pyscipopt.SCIP_PARAMSETTING.OFF)
    xs = [model.addVar(vtype="B") for _ in ilp.cells] + [model.addVar(vtype="C", lb=0.0)]
    for row, lower, upper in zip(ilp.matrix, ilp.lower, ilp.upper):
        expr = pyscipopt.quicksum(float(row[j]) * xs[j] for j in np.flatnonzero(row))
        if lower == upper:
            model.addCons(expr == upper)
            continue
        if lower > -np.inf:
            model.addCons(expr >= lower)
        if upper < np.inf:
            model.addCons(expr <= upper)
    model.setObjective(pyscipopt.quicksum(float(ilp.objective[j]) * xs[j] for j in range(len(xs))), "minimize")
    model.optimize()
    status = model.getStatus()
    if status != "optimal":
        return (), status
    return tuple(i for i in range(len(ilp.cells)) if model.getVal(xs[i]) > 0.5), status


def _solve_milp(ilp: Ilp) -> tuple[tuple[int, ...], str]:
    num_z = len(ilp.cells)
    from scipy.optimize import Bounds, LinearConstraint, milp  # here: only the cross-check needs scipy.optimize

    result = milp(ilp.objective, constraints=LinearConstraint(ilp.matrix, ilp.lower, ilp.upper),
                  integrality=np.append(np.ones(num_z), 0.0), bounds=Bounds(0.0, np.append(np.ones(num_z), np.inf)),
                  # HiGHS's default relative gap (1e-4) spans several ranks once (U + 1) R is
                  # in the 1e5s (256 GPUs): it returned the 3rd plan as the 2nd; ranks need 0
                  options={"mip_rel_gap": 0.0})
    status = {0: "optimal", 2: "infeasible"}.get(result.status, result.message)
    if status != "optimal":
        return (), status
    return tuple(int(i) for i in np.flatnonzero(result.x[:num_z] > 0.5)), status


def top_plans(table: TauTable, top_k: int, solver: str = "scip") -> list[Plan]:
    """The ``top_k`` best plans, best first, by repeated solves with no-good cuts;
    fewer when fewer are feasible (none: an empty list).

    Raises:
        InputError: unknown solver.
        AmpdError: the solver stopped without proving optimality or infeasibility.
    """
    ilp, plans = build_ilp(table), []
    while len(plans) < top_k:
        chosen, status = solve(ilp, solver)
        if status == "infeasible":
            break
        if status != "optimal":
            raise AmpdError(f"planner: {solver} stopped with status {status!r} on plan {len(plans) + 1}")
        prefill, decode = (ilp.cells[i] for i in chosen)
        plans.append(Plan(prefill, decode, status))
        ilp = ilp.with_cut(chosen)
    return plans
