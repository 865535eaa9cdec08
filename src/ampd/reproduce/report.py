"""Writes ``results.json``, the figures and ``tables.md`` of a reproduce run."""

from __future__ import annotations

from pathlib import Path

from ampd.metrics.report import write_json
from ampd.policy.systems import SYSTEMS
from ampd.reproduce import analysis, grid


def _fmt(value) -> str:
    if isinstance(value, float):
        return "-" if value != value else f"{value:.4g}"
    return "-" if value is None else str(value)


def markdown_table(rows: list[dict]) -> str:
    """A GitHub Markdown table of dict rows (floats to 4 significant digits)."""
    if not rows:
        return "(no rows)\n"
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(_fmt(r[k]) for k in head) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def summarize(results: dict) -> dict:
    """Every table of RESULTS.md, computed from the rows of ``results`` (``grid``,
    ``capacities``, ``ablation``, ``ablation_capacities``, ``sensitivity``,
    ``best_deployments``, ``references``): what ``results.json`` holds."""
    grid_rows, capacities = results["grid"], results["capacities"]
    labels = list(dict.fromkeys(r["system"] for r in grid_rows))
    baselines = [s for s in labels if not SYSTEMS[s.removesuffix(grid.PLANNED)].adaptive]
    ours = [s for s in labels if SYSTEMS[s.removesuffix(grid.PLANNED)].adaptive]
    return {
        "reference": results["references"],
        "mean_capacity": analysis.mean_capacity(capacities),
        "capacity_gains": [analysis.capacity_gains(capacities, s, b) for s in ours for b in baselines],
        "gains": [analysis.gains(grid_rows, s, b) for s in ours for b in baselines],
        "mean_attainment": analysis.mean_attainment(grid_rows, "system"),
        "local_share": analysis.local_share(grid_rows),
        "breakdown": analysis.breakdown(grid_rows, grid.SEARCH_FRACTION),
        "ablation": analysis.mean_capacity(results["ablation_capacities"]),
        "ablation_attainment": analysis.mean_attainment(results["ablation"], "system"),
        "sensitivity": analysis.sensitivity(results["sensitivity"]),
        "best_deployments": results["best_deployments"],
    }


def best_rows(best: dict) -> list[dict]:
    """``run.search_best``'s choices as rows (cell, system, deployment, chosen_by)."""
    return [{"cell": c, "system": s, "deployment": str(d), "chosen_by": how} for (c, s), (d, how) in best.items()]


def write(out_dir: Path, quick: bool, results: dict) -> dict:
    """Write results.json (rows and tables), summary.json (per cell, every system's
    capacity and mean attainment: ``analysis.cell_summary``), the PNG figures and
    tables.md."""
    from ampd.reproduce import figures  # here: matplotlib takes ~0.5 s to import, only writing draws

    tables = summarize(results)
    what = figures.describe(results["grid"])
    figures.attainment_grid(results["grid"], results["capacities"], out_dir / "attainment_grid.png")
    figures.capacity_bars(results["capacities"], out_dir / "capacity.png", what)
    figures.bars(tables["breakdown"], "system", ["ttft_over_slo", "ttft_p95_over_slo", "itl_over_slo",
                                                 "itl_p95_over_slo"],
                 out_dir / "latency_breakdown.png", "latency / SLO threshold",
                 f"Latency at {grid.SEARCH_FRACTION:g} x the reference capacity, mean over the cells where the "
                 f"system's run is stable\n{what}")
    figures.bars(tables["ablation"], "system", ["capacity_over_reference"], out_dir / "ablation.png",
                 "capacity / reference capacity", f"Ablation on AMPD's deployment: capacity, mean over cells\n{what}")
    figures.sensitivity(tables["sensitivity"], out_dir / "sensitivity.png", what)
    text = "".join(f"## {name}\n\n{markdown_table(rows)}\n" for name, rows in tables.items())
    (out_dir / "tables.md").write_text(text)
    rows = {k: v for k, v in results.items() if k not in ("tables", "quick")}
    write_json(out_dir / "results.json", {"quick": quick, "tables": tables, **rows})
    write_json(out_dir / "summary.json", {"quick": quick, **analysis.cell_summary(results["grid"],
                                                                                 results["capacities"])})
    return tables
