"""Candidate deployments for the baselines' best-deployment search.

[our choice] The search space a careful operator would hand-tune, kept small
enough to simulate every candidate:
- disaggregated systems: one TP degree per role, every usable pair of degrees
  (the replica must hold the weights with room for KV), and a prefill share of
  the GPUs of 1/4, 3/8, 1/2, 5/8 or 3/4 (rounded down to whole replicas, at
  least one replica per role), every GPU used;
- colocated systems: ``D:<TP=n,DP=N/n>`` for every usable degree n.
"""

from __future__ import annotations

from ampd.core.deployment import Deployment, ReplicaGroup, Role
from ampd.perf.interface import PerfModel

DEGREES = (1, 2, 4, 8)
PREFILL_SHARES = (0.25, 0.375, 0.5, 0.625, 0.75)


def usable_degrees(perf: PerfModel, gpus_per_server: int = 8) -> list[int]:
    """TP degrees the performance model has (``perf.tps``) whose replica holds the
    weights and fits in a server."""
    return [tp for tp in DEGREES if tp in perf.tps and tp <= gpus_per_server and perf.kv_capacity_tokens(tp) > 0]


def disaggregated_candidates(perf: PerfModel, num_gpus: int) -> list[Deployment]:
    """Every P/D split of the search space above, in a stable order."""
    found: dict[str, Deployment] = {}
    degrees = usable_degrees(perf)
    for tp_p in degrees:
        for tp_d in degrees:
            for share in PREFILL_SHARES:
                dp_p = int(num_gpus * share) // tp_p
                rest = num_gpus - dp_p * tp_p
                if dp_p >= 1 and rest >= tp_d and rest % tp_d == 0:
                    d = Deployment.of([ReplicaGroup(Role.PREFILL, tp_p, dp_p), ReplicaGroup(Role.DECODE, tp_d, rest // tp_d)])
                    found.setdefault(str(d), d)
    return list(found.values())


def colocated_candidates(perf: PerfModel, num_gpus: int) -> list[Deployment]:
    """``D:<TP=n,DP=N/n>`` for every usable degree dividing N."""
    return [Deployment.of([ReplicaGroup(Role.DECODE, tp, num_gpus // tp)])
            for tp in usable_degrees(perf) if num_gpus % tp == 0]
