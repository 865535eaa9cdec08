"""Shared by the benchmarks: where results go and what machine produced them."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
REPRODUCE_OUT = Path(__file__).resolve().parent.parent / "out" / "reproduce"
"""``ampd reproduce``'s output: its ``results.json`` and its point cache ``points/``, which the
grid benchmarks read and extend."""


def jobs_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's parser, described by the first line of ``doc``, with ``--jobs``
    (parallel simulations; default every core)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=None, help="parallel simulations (default: every core)")
    return parser


def machine() -> dict:
    """The machine a figure was measured on."""
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": sys.version.split()[0]}


def write_result(name: str, figures: dict) -> Path:
    """Write ``bench/results/<name>.json`` with the figures, the machine and the time."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "machine": machine(), **figures}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {path}")
    return path


async def stream_round(client, url: str, path: str, body: dict, session_id: str) -> tuple[float, float, int]:
    """(TTFT, round time, tokens) of one streamed request (``body`` asks for
    ``token_ids``) to ``url + path`` in session ``session_id``, wall seconds;
    an HTTP error raises (``httpx.HTTPStatusError``)."""
    import time

    start, first, tokens = time.perf_counter(), None, 0
    async with client.stream("POST", f"{url}{path}", json=body, headers={"X-Session-Id": session_id}) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                ids = (json.loads(line[5:]).get("choices") or [{}])[0].get("token_ids") or []
                if ids and first is None:
                    first = time.perf_counter() - start
                tokens += len(ids)
    return first, time.perf_counter() - start, tokens

