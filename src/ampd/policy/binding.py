"""Session binding: pick the decode worker that will own a session's KV cache
(AMPD.md section 3, step 1: the worker with the most free KV memory, taken as a
share of its capacity: [our choice], below)."""

from __future__ import annotations

from ampd.core.view import ClusterView
from ampd.policy.decisions import BindDecision


class MostFreeKvBinder:
    """Binds a session to the decode worker with the most free KV memory as a share of
    its capacity (``kv_free_tokens / kv_capacity_tokens``).

    [our choice] The share, not the tokens: among replicas of one degree (equal
    capacities) the two are the same decision; among replicas of several degrees,
    the share splits sessions in proportion to capacity (AMPD.md section 2, mixed
    degrees; what the planner's mixed decode cells assume: ``ampd.planner.decode_tau``),
    where free tokens would fill the largest replica down to the smaller ones' whole
    capacity before they get a session. Ties go to the lowest worker id, so binding
    is deterministic.
    """

    def bind(self, session_id: str, needed_tokens: int, view: ClusterView) -> BindDecision | None:
        """Choose a decode worker for a new session.

        Args:
            session_id: the arriving session.
            needed_tokens: KV tokens its first round will hold (prompt + output).
            view: current cluster snapshot.

        Returns:
            The decision, or None when no decode worker has ``needed_tokens`` free
            (the caller holds the session until memory frees).
        """
        best = None
        for w in view.decode_workers:
            # free / capacity compared by cross-multiplying: integers, no rounding between equal replicas
            if w.kv_free_tokens >= needed_tokens and (
                    best is None or w.kv_free_tokens * best.kv_capacity_tokens > best.kv_free_tokens * w.kv_capacity_tokens):
                best = w
        if best is None:
            return None
        return BindDecision(session_id, best.worker_id, best.kv_free_tokens)
