"""The simulator's ``EventLoop`` interface (``now_s``, ``at``, ``after``) in real
time, so its worker models (``SimPrefillWorker``, ``SimDecodeWorker``) run
unchanged behind a server (docs/SERVING.md, "Components")."""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable
from typing import Any, TypeVar

from ampd.core.clock import ScaledClock

T = TypeVar("T")


class WallClockLoop:
    """A heap of ``(time_s, priority, seq, callback, args)`` drained by one asyncio
    timer, in model seconds of ``clock``.

    Events run in the simulator's order: by time, then priority, then scheduling
    order. One asyncio timer is armed for the earliest event; when it fires, every
    event due by the clock runs.

    Time inside a callback is the event's own time (``now_s`` is exactly the
    ``time_s`` it was scheduled for, or later when an outside read already moved
    time past it), not the clock: asyncio timers fire up to a millisecond late
    (epoll's resolution), and a chain of decode steps that restarted from the
    clock would add that lateness at every step. Outside callbacks ``now_s``
    reads the clock; ``run_now`` holds it still for work from outside. Either way
    ``now_s`` never goes back.

    Attributes:
        clock: the model clock.
        num_events: events run so far.
    """

    def __init__(self, clock: ScaledClock) -> None:
        self.clock = clock
        self.num_events = 0
        self._heap: list[tuple[float, int, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self._now_s = -math.inf
        self._draining = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_s = math.inf

    @property
    def now_s(self) -> float:
        """Model seconds now (see the class docstring)."""
        if not self._draining:
            self._now_s = max(self._now_s, self.clock.now_s())
        return self._now_s

    def at(self, time_s: float, callback: Callable[..., Any], *args: Any, priority: int = 0) -> None:
        """Run ``callback(*args)`` at model time ``time_s`` (at once when it is past;
        lower priority first among equal times). Call from the running event loop.

        Raises:
            ValueError: ``time_s`` is not finite.
            RuntimeError: no asyncio loop is running.
        """
        if not math.isfinite(time_s):
            raise ValueError(f"cannot schedule at {time_s!r}")
        heapq.heappush(self._heap, (time_s, priority, self._seq, callback, args))
        self._seq += 1
        if not self._draining:
            self._arm()

    def after(self, delay_s: float, callback: Callable[..., Any], *args: Any, priority: int = 0) -> None:
        """Run ``callback(*args)`` ``delay_s`` model seconds from now."""
        self.at(self.now_s + delay_s, callback, *args, priority=priority)

    def run_now(self, callback: Callable[..., T], *args: Any) -> T:
        """Run every event due by the clock, then ``callback(*args)`` at once as an
        event of the current time (``now_s`` holds still while it runs); returns
        what it returns. For work from outside the loop (a new request): it finds
        the workers as they are now and times all it does from one instant."""
        self._drain(-math.inf)
        self._now_s = max(self._now_s, self.clock.now_s())
        self._draining = True
        try:
            return callback(*args)
        finally:
            self._draining = False
            self._drain(self._now_s)

    def _arm(self) -> None:
        head_s = self._heap[0][0] if self._heap else math.inf
        if head_s >= self._timer_s:
            return
        if self._timer is not None:
            self._timer.cancel()
        delay_s = max(0.0, self.clock.wall_s(head_s - self.clock.now_s()))
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._fire, head_s)
        self._timer_s = head_s

    def _fire(self, target_s: float) -> None:
        self._timer, self._timer_s = None, math.inf
        self._drain(target_s)

    def _drain(self, target_s: float) -> None:
        """Run events due by the clock, or by ``target_s`` (the time the timer was
        armed for: it fired, so that time has come even if the wall clock, read
        apart from the timer's monotonic clock, lags a little)."""
        heap = self._heap
        self._draining = True
        try:
            while heap and heap[0][0] <= max(target_s, self.clock.now_s()):
                time_s, _, _, callback, args = heapq.heappop(heap)
                self._now_s = max(self._now_s, time_s)
                self.num_events += 1
                callback(*args)
        finally:
            self._draining = False
            self._arm()
