"""The discrete-event loop: a heap of ``(time_s, priority, seq, callback, args)``.

``seq`` is a running counter, so events at the same time and priority run in
the order they were scheduled and every run is deterministic.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any


class EventLoop:
    """Virtual clock and event heap.

    Attributes:
        now_s: current virtual time, seconds.
        num_events: events run so far.
    """

    def __init__(self) -> None:
        self.now_s = 0.0
        self.num_events = 0
        self._heap: list[tuple[float, int, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self._stopped = False

    def at(self, time_s: float, callback: Callable[..., Any], *args: Any, priority: int = 0) -> None:
        """Run ``callback(*args)`` at ``time_s`` (lower priority first among equal times).

        Raises:
            ValueError: ``time_s`` is in the past or not finite.
        """
        if not (time_s >= self.now_s and math.isfinite(time_s)):
            raise ValueError(f"cannot schedule at {time_s!r}: now is {self.now_s}")
        heapq.heappush(self._heap, (time_s, priority, self._seq, callback, args))
        self._seq += 1

    def after(self, delay_s: float, callback: Callable[..., Any], *args: Any, priority: int = 0) -> None:
        """Run ``callback(*args)`` ``delay_s`` seconds from now."""
        self.at(self.now_s + delay_s, callback, *args, priority=priority)

    def stop(self) -> None:
        """End ``run`` after the event running now."""
        self._stopped = True

    @property
    def idle(self) -> bool:
        """No event left to run."""
        return not self._heap

    def run(self, until_s: float = math.inf) -> None:
        """Run events in time order until the heap is empty, the next event is
        after ``until_s``, or an event calls ``stop``."""
        heap = self._heap
        self._stopped = False
        while heap and heap[0][0] <= until_s and not self._stopped:
            time_s, _, _, callback, args = heapq.heappop(heap)
            self.now_s = time_s
            self.num_events += 1
            callback(*args)
