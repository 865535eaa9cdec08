"""Writing results: JSON and CSV, always with the resolved configuration beside
them so any figure can be reproduced (DESIGN.md section 7)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path

from ampd.metrics.records import SessionRecord


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, data) -> None:
    """Write ``data`` as indented JSON (NaN and infinities become null)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(data), indent=2, default=str) + "\n")


def write_csv(path: Path, rows: Sequence[dict]) -> None:
    """Write dict rows as CSV; the header is every key of every row, in the order
    first seen (a cell a row lacks is empty)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        if not rows:
            return
        writer = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for row in rows for k in row)))
        writer.writeheader()
        writer.writerows(rows)


def round_rows(sessions: Sequence[SessionRecord]) -> list[dict]:
    """One row per round: sizes, placement, TTFT and ITL statistics (seconds)."""
    rows = []
    for s in sessions:
        for r in s.rounds:
            itls = r.itls_s
            num_itls = len(itls)
            rows.append({
                "session_id": r.session_id, "round_index": r.round_index, "ready_s": r.ready_s,
                "hist_tokens": r.hist_tokens, "new_tokens": r.new_tokens, "output_tokens": r.output_tokens,
                "local": r.local, "prefill_worker": r.prefill_worker, "decode_worker": r.decode_worker,
                "ttft_s": r.ttft_s if r.first_token_s is not None else None, "done_s": r.done_s,
                "itl_mean_s": itls.sum_s / num_itls if num_itls else None,
                "itl_max_s": float(itls.values().max()) if num_itls else None,
            })
    return rows


def decision_rows(decisions: Sequence) -> list[dict]:
    """Decision dataclasses as plain dicts, for a JSON Lines log."""
    return [dataclasses.asdict(d) for d in decisions]


def write_jsonl(path: Path, rows: Sequence[dict]) -> None:
    """One JSON object per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(_clean(row), default=str) + "\n")
