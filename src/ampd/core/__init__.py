"""Vocabulary shared by every layer: sessions, rounds, prefill tasks, workers,
deployments and the read-only cluster view. No I/O, no clock, no numpy."""

from ampd.core.deployment import Deployment, ReplicaGroup, Role, WorkerSpec
from ampd.core.errors import AmpdError, InputError
from ampd.core.session import Round, Session
from ampd.core.task import PrefillTask
from ampd.core.view import ClusterView, QueuedTask, WorkerView

__all__ = [
    "AmpdError", "ClusterView", "Deployment", "InputError", "PrefillTask", "QueuedTask",
    "ReplicaGroup", "Role", "Round", "Session", "WorkerSpec", "WorkerView",
]
