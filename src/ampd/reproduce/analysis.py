"""Tables computed from the reproduce rows, beside the paper's figures
(AMPD.md sections 3.1 and 4)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

PAPER_GAIN = {"pd-disagg": (67.29, 967.54), "vllm": (339.74, 3435.1)}  # mean, max % (AMPD.md section 4)
PAPER_LOCAL_SHARE = {"dureader": 31.7, "gaia": 31.3, "hotpotqa": 15.5, "toolbench": 13.9}  # % (section 3.1)


def _by(rows: Sequence[dict], *keys: str) -> dict:
    out = defaultdict(list)
    for r in rows:
        out[tuple(r[k] for k in keys)].append(r)
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def gains(rows: Sequence[dict], system: str, baseline: str) -> dict:
    """Relative attainment gain of ``system`` over ``baseline``, in %, over every
    (cell, rate) point where the baseline attains something: mean and max of
    ``(a_system - a_baseline) / a_baseline``; also the mean gain in percentage
    points over every point, and how many points the baseline scored 0 (left out
    of the relative figures, where the paper's maxima come from)."""
    att = {(r["cell"], r["rate_fraction"], r["system"]): r["slo_attainment"] for r in rows}
    rel, points, zeros = [], [], 0
    for (cell, fraction, name), a in att.items():
        if name != system or (cell, fraction, baseline) not in att:
            continue
        b = att[(cell, fraction, baseline)]
        points.append(100 * (a - b))
        if b > 0:
            rel.append(100 * (a - b) / b)
        else:
            zeros += 1
    return {"system": system, "baseline": baseline, "mean_gain_pct": _mean(rel),
            "max_gain_pct": max(rel) if rel else float("nan"), "mean_gain_points": _mean(points),
            "num_points": len(points), "baseline_zero_points": zeros}


def local_share(rows: Sequence[dict], system: str = "ampd") -> list[dict]:
    """Share of prefills ``system`` ran locally, per workload (mean over models and
    rates, and at the search rate), beside the paper's."""
    out = []
    for (workload,), group in sorted(_by([r for r in rows if r["system"] == system], "workload").items()):
        out.append({"workload": workload, "local_pct": 100 * _mean([r["local_prefill_share"] for r in group]),
                    "local_pct_max": 100 * max(r["local_prefill_share"] for r in group),
                    "paper_pct": PAPER_LOCAL_SHARE.get(workload)})
    return out


def breakdown(rows: Sequence[dict], fraction: float) -> list[dict]:
    """Per system at one rate fraction: mean TTFT and mean ITL, each divided by its
    threshold and averaged over cells (1.0 = at the threshold), and attainment."""
    out = []
    for (system,), group in _by([r for r in rows if r["rate_fraction"] == fraction], "system").items():
        out.append({"system": system,
                    "ttft_over_slo": _mean([r["ttft_mean_s"] / r["ttft_slo_s"] for r in group]),
                    "ttft_p95_over_slo": _mean([r["ttft_p95_s"] / r["ttft_slo_s"] for r in group]),
                    "itl_over_slo": _mean([r["itl_mean_s"] / r["itl_slo_s"] for r in group]),
                    "itl_p95_over_slo": _mean([r["itl_p95_s"] / r["itl_slo_s"] for r in group]),
                    "attainment_pct": 100 * _mean([r["slo_attainment"] for r in group])})
    return out


def mean_attainment(rows: Sequence[dict], *keys: str) -> list[dict]:
    """Mean attainment (%) grouped by ``keys``."""
    return [{**dict(zip(keys, key)), "attainment_pct": 100 * _mean([r["slo_attainment"] for r in group]),
             "num_points": len(group)}
            for key, group in _by(rows, *keys).items()]
