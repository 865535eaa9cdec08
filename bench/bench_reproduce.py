"""Cost of ``ampd reproduce`` (issue: full grid under 60 minutes, ``--quick`` under 5,
on the 2-core development machine): wall time of ``--quick`` into a fresh folder,
and with ``--full`` also of the full grid into ``out/reproduce`` (the run
docs/RESULTS.md quotes), each with its number of simulations and when it ran. Without
``--full`` the last full run's figures are kept as they were measured.

Also copies the full run's per-cell summary (``out/reproduce/summary.json``, written by
``ampd reproduce``: every system's capacity and mean attainment per cell) into
``bench/results/reproduce_summary.json``, with when that run was measured.

Run: ``python bench/bench_reproduce.py [--full]`` -> ``bench/results/reproduce.json``,
``bench/results/reproduce_summary.json``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, write_result  # noqa: E402

from ampd.cli.main import main as ampd  # noqa: E402

FULL_OUT = Path(__file__).resolve().parent.parent / "out" / "reproduce"


def _timed(args: list[str], out: Path) -> dict:
    measured_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    start = time.perf_counter()
    if ampd(["reproduce", "--quiet", "--out", str(out), *args]) != 0:
        raise SystemExit(f"ampd reproduce {' '.join(args)} failed")
    wall_s = time.perf_counter() - start
    figures = {"measured_at": measured_at, "wall_s": wall_s, "wall_min": wall_s / 60,
               "simulations": len(list((out / "points").iterdir()))}
    print(f"reproduce {' '.join(args) or '(full)'}: {figures['simulations']} simulations in {wall_s / 60:.1f} min")
    return figures


def main() -> None:
    previous = RESULTS / "reproduce.json"
    runs = {}
    if previous.exists():
        last = json.loads(previous.read_text())
        runs["full"] = {"measured_at": last["measured_at"], **last["runs"]["full"]}
    with tempfile.TemporaryDirectory() as tmp:
        runs["quick"] = _timed(["--quick"], Path(tmp))
    if "--full" in sys.argv:
        shutil.rmtree(FULL_OUT, ignore_errors=True)
        runs["full"] = _timed([], FULL_OUT)
    write_result("reproduce", {"runs": runs, "targets_min": {"quick": 5, "full": 60}})
    write_summary(runs["full"]["measured_at"])


def write_summary(full_measured_at: str) -> None:
    """``bench/results/reproduce_summary.json`` from the full run's ``summary.json``."""
    summary = json.loads((FULL_OUT / "summary.json").read_text())
    write_result("reproduce_summary", {"run": "out/reproduce (ampd reproduce, full grid)",
                                       "run_measured_at": full_measured_at, **summary})


if __name__ == "__main__":
    main()
