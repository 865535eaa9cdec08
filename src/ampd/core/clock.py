"""Model time for serving: wall time divided by a time scale (docs/SERVING.md, "Time")."""

from __future__ import annotations

import asyncio
import math
import time


class ScaledClock:
    """Model seconds = wall seconds / ``time_scale``.

    With ``time_scale = 1`` model time is wall time; with ``0.01`` a model second
    lasts 10 wall milliseconds, so a trace runs 100 times faster while every
    duration stays in model seconds. ``now_s`` counts from the Unix epoch, so
    processes sharing a ``time_scale`` agree on it.

    Raises:
        ValueError: ``time_scale`` is not a finite number > 0.
    """

    def __init__(self, time_scale: float = 1.0) -> None:
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise ValueError(f"time_scale must be a finite number > 0, got {time_scale!r}")
        self.time_scale = time_scale

    def now_s(self) -> float:
        """Current model time, seconds."""
        return time.time() / self.time_scale

    def wall_s(self, model_s: float) -> float:
        """Wall seconds that ``model_s`` model seconds last."""
        return model_s * self.time_scale

    def model_s(self, wall_s: float) -> float:
        """Model seconds that ``wall_s`` wall seconds last."""
        return wall_s / self.time_scale

    async def sleep(self, model_s: float) -> None:
        """Sleep ``model_s`` model seconds (none when <= 0)."""
        await asyncio.sleep(max(0.0, self.wall_s(model_s)))
