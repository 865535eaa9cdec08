"""A plan: one prefill cell and one decode cell of the tau table, and the order
plans are ranked in (AMPD.md section 2; docs/PLANNER.md, "Objective and ties")."""

from __future__ import annotations

from dataclasses import dataclass

from ampd.core.deployment import Deployment
from ampd.planner.cells import TauCell


@dataclass(frozen=True)
class Plan:
    """A deployment the planner proposes.

    Attributes:
        prefill: the prefill replicas (``P:<TP=n,DP=k>``) and their tau.
        decode: the decode replicas (``D:<TP=n,DP=k>``, or with mixed degrees
            ``D:<TP=n,DP=k>+<TP=m,DP=j>``) and their tau.
        status: the solver's status for the solve that found it (``"optimal"``), or
            ``"enumerated"`` when exhaustive enumeration listed it.
    """

    prefill: TauCell
    decode: TauCell
    status: str

    @property
    def deployment(self) -> Deployment:
        """The plan as a ``Deployment``; prints as ``P:<TP=2,DP=2> D:<TP=4,DP=1>``."""
        return Deployment.of([*self.prefill.groups, *self.decode.groups])

    @property
    def objective(self) -> float:
        """Z: the worse of tau_pre and tau_dec, each P95 / its SLO threshold."""
        return max(self.prefill.tau, self.decode.tau)

    @property
    def num_gpus(self) -> int:
        """GPUs the plan uses."""
        return self.prefill.gpus + self.decode.gpus

    @property
    def order_key(self) -> tuple[tuple, tuple]:
        """Plans rank by this, smallest first: the binding cell's order key (tau, then
        fewer GPUs, ...), then the other cell's. So Z first; at equal Z the better
        other side; exact ties of tau to fewer GPUs. Strict: two plans never tie."""
        keys = sorted((self.prefill.order_key, self.decode.order_key))
        return (keys[1], keys[0])

    def to_dict(self) -> dict:
        """JSON-ready: deployment, Z, GPUs, status and both cells."""
        return {"deployment": str(self.deployment), "objective": self.objective, "num_gpus": self.num_gpus,
                "status": self.status, "prefill": self.prefill.to_dict(), "decode": self.decode.to_dict()}
