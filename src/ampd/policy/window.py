"""Sliding-window mean of a latency (AMPD.md section 3: each worker keeps the
average TTFT or ITL it delivered in the last ``window_s`` seconds)."""

from __future__ import annotations

from collections import deque


class SlidingWindowMean:
    """Mean of the samples added in the last ``window_s`` seconds.

    The caller passes the time of every sample and of every query, so the same
    object serves virtual (simulated) and wall-clock time. Samples that share a
    time (one decode step yields the same gap for every sequence in its batch)
    are stored as one entry with a count.
    """

    def __init__(self, window_s: float = 10.0) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._entries: deque[tuple[float, float, int]] = deque()
        self._sum = 0.0
        self._count = 0

    def add(self, time_s: float, value: float, count: int = 1) -> None:
        """Record ``count`` samples of ``value`` observed at ``time_s``
        (times must not decrease)."""
        self._entries.append((time_s, value * count, count))
        self._sum += value * count
        self._count += count

    def mean(self, now_s: float) -> float | None:
        """Mean of the samples in ``(now_s - window_s, now_s]``; None when empty."""
        horizon = now_s - self.window_s
        entries = self._entries
        while entries and entries[0][0] <= horizon:
            _, total, count = entries.popleft()
            self._sum -= total
            self._count -= count
        if not entries:
            self._sum, self._count = 0.0, 0
            return None
        return self._sum / self._count
