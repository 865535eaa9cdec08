"""Tables computed from the reproduce rows, beside the paper's figures
(AMPD.md sections 3.1 and 4). Only steady-state points enter an attainment
figure (AMPD.md section 6): an unstable point's attainment measures how long its
run was, so it is counted, not averaged."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from ampd.measure import STABLE
from ampd.measure.capacity import meets_slo

PAPER_GAIN = {"pd-disagg": (67.29, 967.54), "vllm": (339.74, 3435.1)}  # mean, max % (AMPD.md section 4)
PAPER_LOCAL_SHARE = {"dureader": 31.7, "gaia": 31.3, "hotpotqa": 15.5, "toolbench": 13.9}  # % (section 3.1)


def _by(rows: Sequence[dict], *keys: str) -> dict:
    out = defaultdict(list)
    for r in rows:
        out[tuple(r[k] for k in keys)].append(r)
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _stable(rows: Sequence[dict]) -> list[dict]:
    return [r for r in rows if r["verdict"] == STABLE]


def capacity_gains(capacities: Sequence[dict], system: str, baseline: str) -> dict:
    """Capacity of ``system`` over ``baseline``, cell by cell: the ratio's mean,
    min and max as gains in % (``100 x (ratio - 1)``). Cells where the baseline
    has no capacity (met the SLO at no rate) are counted apart
    (``baseline_zero_cells``): their ratio is unbounded."""
    cap = {(r["cell"], r["system"]): r["capacity_per_s"] for r in capacities}
    ratios, zeros = [], 0
    for (cell, name), c in cap.items():
        if name != system or (cell, baseline) not in cap:
            continue
        b = cap[(cell, baseline)]
        if b > 0:
            ratios.append(c / b)
        else:
            zeros += 1
    gains = [100 * (x - 1) for x in ratios]
    return {"system": system, "baseline": baseline, "mean_capacity_gain_pct": _mean(gains),
            "min_capacity_gain_pct": min(gains) if gains else math.nan,
            "max_capacity_gain_pct": max(gains) if gains else math.nan,
            "num_cells": len(ratios), "baseline_zero_cells": zeros}


def gains(rows: Sequence[dict], system: str, baseline: str) -> dict:
    """Relative attainment gain of ``system`` over ``baseline``, in %, over the
    (cell, rate) points where both runs are stable and the baseline attains
    something: mean and max of ``(a_system - a_baseline) / a_baseline``; also the
    mean gain in percentage points over the points where both are stable, how
    many points the baseline scored 0 (left out of the relative figures, where
    the paper's maxima come from), and how many points had an unstable run."""
    att = {(r["cell"], r["rate_fraction"], r["system"]): r for r in rows}
    rel, points, zeros, unstable = [], [], 0, 0
    for (cell, fraction, name), row in att.items():
        if name != system or (cell, fraction, baseline) not in att:
            continue
        other = att[(cell, fraction, baseline)]
        if row["verdict"] != STABLE or other["verdict"] != STABLE:
            unstable += 1
            continue
        a, b = row["slo_attainment"], other["slo_attainment"]
        points.append(100 * (a - b))
        if b > 0:
            rel.append(100 * (a - b) / b)
        else:
            zeros += 1
    return {"system": system, "baseline": baseline, "mean_gain_pct": _mean(rel),
            "max_gain_pct": max(rel) if rel else float("nan"), "mean_gain_points": _mean(points),
            "num_points": len(points), "baseline_zero_points": zeros, "unstable_points": unstable}


def local_share(rows: Sequence[dict], system: str = "ampd") -> list[dict]:
    """Share of prefills ``system`` ran locally, per workload (mean and max over its
    stable points of every model and rate), beside the paper's."""
    out = []
    for (workload,), group in sorted(_by(_stable([r for r in rows if r["system"] == system]), "workload").items()):
        out.append({"workload": workload, "local_pct": 100 * _mean([r["local_prefill_share"] for r in group]),
                    "local_pct_max": 100 * max(r["local_prefill_share"] for r in group),
                    "paper_pct": PAPER_LOCAL_SHARE.get(workload)})
    return out


def breakdown(rows: Sequence[dict], fraction: float) -> list[dict]:
    """Per system at one rate fraction, over the cells where its run is stable:
    mean and P95 TTFT and ITL, each divided by its threshold and averaged (1.0 =
    at the threshold), attainment, and how many cells were unstable."""
    out = []
    for (system,), group in _by([r for r in rows if r["rate_fraction"] == fraction], "system").items():
        stable = _stable(group)
        out.append({"system": system,
                    "ttft_over_slo": _mean([r["ttft_mean_s"] / r["ttft_slo_s"] for r in stable]),
                    "ttft_p95_over_slo": _mean([r["ttft_p95_s"] / r["ttft_slo_s"] for r in stable]),
                    "itl_over_slo": _mean([r["itl_mean_s"] / r["itl_slo_s"] for r in stable]),
                    "itl_p95_over_slo": _mean([r["itl_p95_s"] / r["itl_slo_s"] for r in stable]),
                    "attainment_pct": 100 * _mean([r["slo_attainment"] for r in stable]),
                    "unstable_cells": len(group) - len(stable)})
    return out


def mean_attainment(rows: Sequence[dict], *keys: str) -> list[dict]:
    """Mean attainment (%) of the stable points grouped by ``keys``, with the
    number of stable and unstable points."""
    out = []
    for key, group in _by(rows, *keys).items():
        stable = _stable(group)
        out.append({**dict(zip(keys, key)), "attainment_pct": 100 * _mean([r["slo_attainment"] for r in stable]),
                    "num_points": len(stable), "unstable_points": len(group) - len(stable)})
    return out


def sensitivity(rows: Sequence[dict]) -> list[dict]:
    """Per (knob, value): the cells whose run meets the SLO in steady state
    (``meets_slo``: stable and >= 90 %), and the mean attainment over the cells
    where every value of that knob ran stable (the same cells for each value,
    so the means compare), with how many cells that is."""
    out = []
    for (knob,), group in _by(rows, "knob").items():
        by_cell = _by(group, "cell")
        common = {cell for (cell,), runs in by_cell.items() if all(r["verdict"] == STABLE for r in runs)}
        for (value,), runs in _by(group, "value").items():
            kept = [r for r in runs if r["cell"] in common]
            out.append({"knob": knob, "value": value, "cells_meeting_slo": sum(meets_slo(r) for r in runs),
                        "attainment_pct": 100 * _mean([r["slo_attainment"] for r in kept]),
                        "common_stable_cells": len(kept), "num_cells": len(runs)})
    return out


def mean_capacity(capacities: Sequence[dict]) -> list[dict]:
    """Per system: capacity relative to the cell's reference (plain PD
    disaggregation on an even split), averaged over cells, and per GPU."""
    out = []
    for (system,), group in _by(capacities, "system").items():
        out.append({"system": system,
                    "capacity_over_reference": _mean([r["capacity_per_s"] / r["reference_per_s"] for r in group]),
                    "capacity_per_gpu_mean": _mean([r["capacity_per_gpu"] for r in group]),
                    "num_cells": len(group)})
    return sorted(out, key=lambda r: -r["capacity_over_reference"])


def cell_summary(grid_rows: Sequence[dict], capacities: Sequence[dict]) -> dict:
    """Per cell, every system's capacity (sessions/s) and its mean steady-state
    attainment over the cell's rates; over the grid, each system's mean capacity over
    the cell's reference, mean attainment and the cells where its capacity is the
    highest (ties count for each). What ``summary.json`` holds (issue 12).

    An unstable run's queues grow without bound, so its steady-state attainment is 0
    [our choice: the limit of a run that grows longer; the figure it read over its
    finite window depends on the window]; ``unstable_rates`` says how many there were.
    A system the grid did not find a capacity for in a cell is left out of that cell's
    best.
    """
    capacity = {(r["cell"], r["system"]): r for r in capacities}
    cells: dict[str, dict] = {}
    for (cell, system), runs in _by(grid_rows, "cell", "system").items():
        entry = cells.setdefault(cell, {"cell": cell, "systems": {}})
        found = capacity.get((cell, system))
        if found is not None:
            entry["reference_per_s"] = found["reference_per_s"]
        entry["systems"][system] = {
            "capacity_per_s": found["capacity_per_s"] if found else None,
            "mean_attainment_pct": 100 * _mean([r["slo_attainment"] if r["verdict"] == STABLE else 0.0 for r in runs]),
            "unstable_rates": sum(r["verdict"] != STABLE for r in runs), "num_rates": len(runs)}
    for entry in cells.values():
        found = {s: v["capacity_per_s"] for s, v in entry["systems"].items() if v["capacity_per_s"] is not None}
        top = max(found.values(), default=None)
        entry["best"] = sorted(s for s, c in found.items() if c == top)
    systems = sorted({s for entry in cells.values() for s in entry["systems"]})
    overall = []
    for system in systems:
        mine = [e for e in cells.values() if system in e["systems"]]
        ratios = [e["systems"][system]["capacity_per_s"] / e["reference_per_s"] for e in mine
                  if e["systems"][system]["capacity_per_s"] is not None and e.get("reference_per_s")]
        overall.append({"system": system, "capacity_over_reference": _mean(ratios) if ratios else None,
                        "mean_attainment_pct": _mean([e["systems"][system]["mean_attainment_pct"] for e in mine]),
                        "best_cells": sum(system in e["best"] for e in mine), "num_cells": len(mine)})
    overall.sort(key=lambda r: -(r["capacity_over_reference"] or 0.0))
    return {"cells": list(cells.values()), "systems": overall}
