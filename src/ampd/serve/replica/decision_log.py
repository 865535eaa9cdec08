"""Every decision a coordinator replica takes (bindings, routes, fallbacks,
rebinds), kept for inspection and optionally appended to a JSON Lines file, so
a served run can be explained afterwards as a simulated one can."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import deque
from pathlib import Path


class DecisionLog:
    """Bounded in-memory log plus an optional JSON Lines file.

    Args:
        path: file appended to (one JSON object per line); None: memory only.
        keep: how many recent entries stay in memory.
    """

    def __init__(self, path: str | Path | None = None, keep: int = 100_000) -> None:
        self.entries: deque[dict] = deque(maxlen=keep)
        self._file = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", buffering=1)  # noqa: SIM115 (closed in close())

    def add(self, kind: str, decision: object, **extra: object) -> None:
        """Record ``decision`` (a dataclass or a dict) under ``kind``. A figure that
        is not finite (a route option ruled out, e.g. a local prefill that would
        break the batch's ITL budget: infinite TTFT) is kept as None, JSON having
        no infinity, so the log and ``/ampd/decisions`` stay valid JSON."""
        row = dataclasses.asdict(decision) if dataclasses.is_dataclass(decision) else dict(decision)
        row = _finite({"kind": kind, **row, **extra})
        self.entries.append(row)
        if self._file is not None:
            self._file.write(json.dumps(row, default=str) + "\n")

    def of_kind(self, kind: str) -> list[dict]:
        return [e for e in self.entries if e["kind"] == kind]

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _finite(value: object) -> object:
    """``value`` with every non-finite float inside it (dicts, lists, tuples) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
