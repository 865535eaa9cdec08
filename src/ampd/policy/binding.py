"""Session binding: pick the decode worker that will own a session's KV cache
(AMPD.md section 3, step 1: the worker with the most free KV memory)."""

from __future__ import annotations

from ampd.core.view import ClusterView
from ampd.policy.decisions import BindDecision


class MostFreeKvBinder:
    """Binds a session to the decode worker with the most free KV tokens.

    Ties go to the lowest worker id, so binding is deterministic.
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
            if w.kv_free_tokens >= needed_tokens and (best is None or w.kv_free_tokens > best.kv_free_tokens):
                best = w
        if best is None:
            return None
        return BindDecision(session_id, best.worker_id, best.kv_free_tokens)
