"""Fit report of the performance model against the measured Splitwise profiles.

Run: ``python bench/bench_perf_model.py``. Writes ``bench/results/perf_model.json``: the MAPE
of the calibrated roofline and of the alpha-beta model per GPU, TP and function, the
calibrated efficiencies, the example values quoted in docs/PERF_MODEL.md, the cost of one
call, and the machine it ran on.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import timeit
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ampd.perf import CALIBRATED, build_perf_model, format_table, load_profile, mape_table  # noqa: E402
from ampd.perf.calibrate import FIT_DATE, FIT_SOURCE  # noqa: E402

RESULT = Path(__file__).resolve().parent / "results" / "perf_model.json"


def examples() -> dict:
    """The values the project quotes for Llama-3.1-70B on H20 at TP 4 (seconds, tokens)."""
    m = build_perf_model("Llama-3.1-70B", "H20")
    return {"model": "Llama-3.1-70B", "gpu": "H20", "tp": 4,
            "prefill_s(0,703)": m.prefill_s(0, 703, 4), "prefill_s(5000,500)": m.prefill_s(5000, 500, 4),
            "decode_step_s(32,64000)": m.decode_step_s(32, 32 * 2000, 4),
            "kv_capacity_tokens": m.kv_capacity_tokens(4)}


def call_cost_us() -> float:
    """Mean microseconds of one ``prefill_s`` call (informative; machine-dependent)."""
    m = build_perf_model("Llama-3.1-70B", "H20")
    calls = 200_000
    return timeit.timeit(lambda: m.prefill_s(5000, 500, 4), number=calls) / calls * 1e6


def main() -> None:
    profile = load_profile()
    rows = mape_table(profile)
    print(format_table(rows))
    result = {
        "mape": [asdict(r) for r in rows],
        "dropped_measurements": list(profile.dropped),
        "calibration": {"date": FIT_DATE, "source": FIT_SOURCE,
                        "efficiency": {name: asdict(eff) for name, eff in CALIBRATED.items()}},
        "examples": examples(),
        "prefill_call_us": call_cost_us(),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()},
    }
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
