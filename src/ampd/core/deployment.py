"""Deployments: how many prefill and decode replicas run at which TP degree,
and where their GPUs sit.

Printed and parsed in the paper's notation, ``P:<TP=2,DP=2> D:<TP=4,DP=1>``; a role
with replicas of several degrees lists several groups: ``P:<TP=1,DP=2>+<TP=2,DP=1>``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from ampd.core.errors import InputError


class Role(str, enum.Enum):
    """What a worker does: prefill only, or decode (and local prefills)."""

    PREFILL = "P"
    DECODE = "D"


@dataclass(frozen=True, slots=True)
class ReplicaGroup:
    """``dp`` identical replicas of one role, each over ``tp`` GPUs."""

    role: Role
    tp: int
    dp: int

    def __str__(self) -> str:
        return f"<TP={self.tp},DP={self.dp}>"


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """One replica: ``tp`` GPUs of one server, all serving one role.

    Attributes:
        worker_id: index in ``Deployment.workers()``, 0-based, prefill workers first.
        role: prefill or decode.
        tp: tensor-parallel degree (GPUs of the replica).
        server: index of the server whose GPUs it uses (TP never spans servers,
            so its all-reduce stays on NVLink).
    """

    worker_id: int
    role: Role
    tp: int
    server: int


_GROUP = re.compile(r"<\s*TP\s*=\s*(\d+)\s*,\s*DP\s*=\s*(\d+)\s*>", re.IGNORECASE)
_ROLE = re.compile(r"^\s*([PD])\s*:\s*(.+?)\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Deployment:
    """A set of replica groups; prefill groups come before decode groups."""

    groups: tuple[ReplicaGroup, ...]

    @classmethod
    def parse(cls, text: str) -> "Deployment":
        """Parse ``P:<TP=2,DP=2> D:<TP=4,DP=1>``.

        Raises:
            InputError: the text does not follow the notation, a degree or count
                is not positive, or the deployment has no decode replica.
        """
        groups: list[ReplicaGroup] = []
        for part in text.split():
            m = _ROLE.match(part)
            if not m:
                raise InputError(f"deployment {text!r}: cannot read {part!r}; expected e.g. 'P:<TP=2,DP=2> D:<TP=4,DP=1>'")
            role = Role(m.group(1).upper())
            for piece in m.group(2).split("+"):
                g = _GROUP.fullmatch(piece.strip())
                if not g:
                    raise InputError(f"deployment {text!r}: cannot read group {piece!r}; expected '<TP=n,DP=k>'")
                tp, dp = int(g.group(1)), int(g.group(2))
                if tp < 1 or dp < 1:
                    raise InputError(f"deployment {text!r}: TP and DP must be >= 1 in {piece!r}")
                groups.append(ReplicaGroup(role, tp, dp))
        return cls.of(groups, source=text)

    @classmethod
    def of(cls, groups: list[ReplicaGroup] | tuple[ReplicaGroup, ...], source: str = "") -> "Deployment":
        """Build from groups, prefill first. Raises InputError without a decode group."""
        ordered = tuple(g for g in groups if g.role is Role.PREFILL) + tuple(g for g in groups if g.role is Role.DECODE)
        if not any(g.role is Role.DECODE for g in ordered):
            raise InputError(f"deployment {source or ordered!r}: needs at least one decode replica (D:<TP=n,DP=k>)")
        return cls(ordered)

    @property
    def num_gpus(self) -> int:
        """GPUs the deployment uses: sum of TP x DP over groups."""
        return sum(g.tp * g.dp for g in self.groups)

    def __str__(self) -> str:
        parts = []
        for role in (Role.PREFILL, Role.DECODE):
            gs = [str(g) for g in self.groups if g.role is role]
            if gs:
                parts.append(f"{role.value}:" + "+".join(gs))
        return " ".join(parts)

    def workers(self, num_gpus: int, gpus_per_server: int = 8) -> tuple[WorkerSpec, ...]:
        """Place every replica on servers of ``gpus_per_server`` GPUs.

        Placement is first-fit by decreasing TP (a replica never spans servers);
        worker ids follow the deployment's group order.

        Raises:
            InputError: the deployment needs more than ``num_gpus`` GPUs, a TP degree
                exceeds a server, or the replicas cannot be packed on the servers.
        """
        if self.num_gpus > num_gpus:
            raise InputError(f"deployment {self}: needs {self.num_gpus} GPUs, the cluster has {num_gpus}")
        num_servers = -(-num_gpus // gpus_per_server)
        free = [min(gpus_per_server, num_gpus - s * gpus_per_server) for s in range(num_servers)]
        flat = [(g.role, g.tp) for g in self.groups for _ in range(g.dp)]
        servers = [0] * len(flat)
        for idx in sorted(range(len(flat)), key=lambda i: (-flat[i][1], i)):
            tp = flat[idx][1]
            if tp > gpus_per_server:
                raise InputError(f"deployment {self}: TP={tp} exceeds {gpus_per_server} GPUs per server")
            server = next((s for s in range(num_servers) if free[s] >= tp), None)
            if server is None:
                raise InputError(f"deployment {self}: replicas do not pack onto {num_servers} server(s) of {gpus_per_server} GPUs")
            free[server] -= tp
            servers[idx] = server
        return tuple(WorkerSpec(i, role, tp, servers[i]) for i, (role, tp) in enumerate(flat))
