"""KV memory of one decode (or colocated) replica, per bound session.

Three retention policies, one per kind of system:

- ``resident`` (AMPD, PD disaggregation; AMPD.md section 3): a session's KV stays
  on its decode worker from binding to its end, tool calls included; nothing is
  evicted. [our choice] Later rounds may overcommit the replica (no preemption).
- ``lru`` (vLLM with prefix caching): while a session waits for a tool its KV is
  only cached, and is evicted, least recently used first, when a starting round
  needs the room; the session then recomputes the history it lost.
- ``pinned`` (vLLM-Continuum): like ``lru``, but a session's KV is pinned for
  ``pin_ttl_s`` after each round, so a tool call shorter than that finds it.
"""

from __future__ import annotations

from collections import OrderedDict

RETENTION_POLICIES = ("resident", "lru", "pinned")


class SessionKvCache:
    """Per-session KV tokens of one replica (see the module docstring).

    Args:
        capacity_tokens: KV tokens the replica holds.
        retention: one of ``RETENTION_POLICIES``.
        pin_ttl_s: how long ``pinned`` keeps an idle session's KV.

    Raises:
        ValueError: unknown retention policy.
    """

    def __init__(self, capacity_tokens: int, retention: str = "resident", pin_ttl_s: float = 0.0) -> None:
        if retention not in RETENTION_POLICIES:
            raise ValueError(f"unknown KV retention {retention!r}; known: {', '.join(RETENTION_POLICIES)}")
        self.capacity_tokens, self.retention, self.pin_ttl_s = capacity_tokens, retention, pin_ttl_s
        self._tokens: dict[str, int] = {}
        self._held = 0
        self._idle: OrderedDict[str, float] = OrderedDict()  # session -> idle since (s), oldest first

    @property
    def held_tokens(self) -> int:
        """KV tokens held now, cached idle sessions included."""
        return self._held

    def used_tokens(self, now_s: float) -> int:
        """KV tokens that cannot be given to a new session now: all of them when
        nothing is evictable, else those of active and still-pinned sessions."""
        if self.retention == "resident":
            return self.held_tokens
        return self.held_tokens - sum(self._tokens[s] for s in self._evictable(now_s))

    def begin_round(self, session_id: str, hist_tokens: int, round_tokens: int, now_s: float) -> int:
        """A round of ``session_id`` starts and will add ``round_tokens`` (input +
        output). Returns how many of its ``hist_tokens`` of history are still held
        (fewer than ``hist_tokens`` when its KV was evicted: the rest is recomputed)."""
        cached = min(self._tokens.get(session_id, 0), hist_tokens)
        self._idle.pop(session_id, None)
        self._set(session_id, hist_tokens + round_tokens)
        self._make_room(now_s)
        return cached

    def end_round(self, session_id: str, now_s: float) -> None:
        """The session's round ended; it now waits for a tool."""
        self._idle[session_id] = now_s

    def end_session(self, session_id: str) -> None:
        """The session ended: its KV is freed."""
        self._set(session_id, 0)
        self._idle.pop(session_id, None)

    def _set(self, session_id: str, tokens: int) -> None:
        self._held += tokens - self._tokens.pop(session_id, 0)
        if tokens:
            self._tokens[session_id] = tokens

    def _evictable(self, now_s: float) -> list[str]:
        if self.retention == "resident":
            return []
        ttl_s = self.pin_ttl_s if self.retention == "pinned" else 0.0
        return [s for s, since in self._idle.items() if now_s - since >= ttl_s]

    def _make_room(self, now_s: float) -> None:
        excess = self.held_tokens - self.capacity_tokens
        for session_id in self._evictable(now_s):
            if excess <= 0:
                return
            excess -= self._tokens[session_id]
            self._set(session_id, 0)
            del self._idle[session_id]
