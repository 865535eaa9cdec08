"""One cell of the tau table: k replicas of degree n in one role (with mixed degrees,
a further group of another degree beside them), and its P95 latency normalised by
the SLO threshold (AMPD.md section 2, [our choice])."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from ampd.core.deployment import ReplicaGroup, Role


@dataclass(frozen=True)
class TauCell:
    """``dp`` replicas of degree ``tp`` carrying the whole load of ``role``, with the
    replicas of ``extra`` beside them when the role mixes degrees.

    Attributes:
        role: prefill (TTFT side) or decode (ITL side).
        tp, dp: the degree n and the count k (of the main group, when mixed).
        extra: further groups of the role sharing its load (mixed degrees:
            ``decode_tau.mixed_decode_cells``, ``prefill_tau.mixed_prefill_cells``);
            empty for one degree.
        p95_s: P95 TTFT of the remote prefills (prefill) or P95 ITL (decode), seconds,
            the worst group's for a mixed decode side (a mixed prefill side's tasks share
            one queue: their P95); None when the cell is overloaded.
        threshold_s: the SLO threshold ``p95_s`` is normalised by.
        kv_tokens: P95 KV tokens one decode replica of ``tp`` GPUs holds (0 for prefill
            replicas, which only need the weights to fit); mixed: the main group's
            replica at the fullest group's share of its capacity.
        kv_capacity_tokens: KV tokens one replica of ``tp`` GPUs holds.
        reason: why the cell is overloaded; empty otherwise.
        local_share: prefill cells under the router model (docs/PLANNER.md,
            "Co-design"): the share of the window's prefills the router runs on decode
            replicas when this cell is the prefill side; else 0 (a fixed share is the
            table's, ``TauTable.local_share``).
        local_tasks: indices in the nominal stream of those local prefills (not
            compared: they follow from the other fields).
    """

    role: Role
    tp: int
    dp: int
    p95_s: float | None
    threshold_s: float
    kv_tokens: int
    kv_capacity_tokens: int
    reason: str = ""
    local_share: float = 0.0
    extra: tuple[ReplicaGroup, ...] = ()
    local_tasks: tuple[int, ...] = field(default=(), compare=False, repr=False)

    @property
    def overloaded(self) -> bool:
        """No steady state: work arrives faster than the replicas serve it."""
        return self.p95_s is None

    @property
    def tau(self) -> float | None:
        """``p95_s / threshold_s`` (dimensionless; 1.0 = at the threshold); None when overloaded."""
        return None if self.p95_s is None else self.p95_s / self.threshold_s

    @property
    def fits_memory(self) -> bool:
        """Each replica holds the weights plus its share of resident session KV."""
        return self.kv_tokens <= self.kv_capacity_tokens

    @property
    def usable(self) -> bool:
        """Not overloaded and within memory: a plan may use this cell."""
        return not self.overloaded and self.fits_memory

    @property
    def gpus(self) -> int:
        """GPUs of the cell: ``tp x dp``, plus the extra groups'."""
        return sum(g.tp * g.dp for g in self.groups)

    def gpus_from_degree(self, degree: int) -> int:
        """GPUs of the cell's replicas of ``degree`` GPUs or more (the ILP's packing rows)."""
        return sum(g.tp * g.dp for g in self.groups if g.tp >= degree)

    @property
    def order_key(self) -> tuple[float, int, int, int, tuple[int, ...]]:
        """The strict total order of usable cells the planner ranks by: tau, then fewer
        GPUs, then prefill before decode, then smaller degree, then one degree before
        mixed ones (smaller extra degrees first). Raises TypeError when overloaded
        (no tau)."""
        if self.tau is None:
            raise TypeError(f"{self.label}: overloaded, no tau to order by")
        return (self.tau, self.gpus, 0 if self.role is Role.PREFILL else 1, self.tp,
                tuple(g.tp for g in self.extra))

    @property
    def groups(self) -> tuple[ReplicaGroup, ...]:
        """The replica groups in ``Deployment`` terms: the main one, then ``extra``."""
        return (ReplicaGroup(self.role, self.tp, self.dp),) + self.extra

    @property
    def label(self) -> str:
        """e.g. ``P:<TP=2,DP=3>``, or ``D:<TP=4,DP=1>+<TP=2,DP=1>`` mixed."""
        return f"{self.role.value}:" + "+".join(map(str, self.groups))

    def to_dict(self) -> dict:
        """JSON-ready fields and tau."""
        return {"role": self.role.value, "tp": self.tp, "dp": self.dp, "p95_s": self.p95_s, "tau": self.tau,
                "threshold_s": self.threshold_s, "kv_tokens": self.kv_tokens,
                "kv_capacity_tokens": self.kv_capacity_tokens, "reason": self.reason,
                "local_share": self.local_share, "extra": [str(g) for g in self.extra]}


def mixtures(degrees: Sequence[int], max_gpus: int) -> Iterator[tuple[int, int, int, range]]:
    """The two-degree sides both roles consider (docs/PLANNER.md, "Mixed degrees"): for
    degrees a < b, j replicas of degree a with 1 <= j and j a < b (the GPUs that make no
    further replica of degree b), beside k replicas of degree b for every k >= 1 within
    ``max_gpus``. Yields ``(b, a, j, ks)``, ``ks`` the counts k."""
    for b in degrees:
        for a in (n for n in degrees if n < b):
            for j in range(1, -(-b // a)):
                yield b, a, j, range(1, (max_gpus - j * a) // b + 1)
