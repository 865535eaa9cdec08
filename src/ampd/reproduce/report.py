"""Writes ``results.json``, the figures and ``tables.md`` of a reproduce run."""

from __future__ import annotations

from pathlib import Path

from ampd.metrics.report import write_json
from ampd.policy.systems import SYSTEMS
from ampd.reproduce import analysis, figures, grid


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


def summarize(grid_rows, ablation_rows, sensitivity_rows, best) -> dict:
    """Every table of RESULTS.md, computed from the rows."""
    baselines = [s for s in grid.DISAGGREGATED + grid.COLOCATED if not SYSTEMS[s].adaptive]
    ours = [s for s in dict.fromkeys(r["system"] for r in grid_rows) if SYSTEMS[s.removesuffix(grid.PLANNED)].adaptive]
    return {
        "gains": [analysis.gains(grid_rows, s, b) for s in ours for b in baselines],
        "local_share": analysis.local_share(grid_rows),
        "breakdown": analysis.breakdown(grid_rows, grid.SEARCH_FRACTION),
        "ablation": analysis.mean_attainment(ablation_rows, "system"),
        "sensitivity": analysis.mean_attainment(sensitivity_rows, "knob", "value"),
        "mean_attainment": analysis.mean_attainment(grid_rows, "system"),
        "best_deployments": [{"cell": c, "system": s, "deployment": str(d), "chosen_by": how}
                             for (c, s), (d, how) in best.items()],
    }


def write(out_dir: Path, quick: bool, grid_rows, ablation_rows, sensitivity_rows, best) -> dict:
    """Write results.json (rows and tables), the PNG figures and tables.md."""
    tables = summarize(grid_rows, ablation_rows, sensitivity_rows, best)
    write_json(out_dir / "results.json", {"quick": quick, "tables": tables, "grid": grid_rows,
                                          "ablation": ablation_rows, "sensitivity": sensitivity_rows})
    figures.attainment_grid(grid_rows, out_dir / "attainment_grid.png")
    figures.bars(tables["breakdown"], "system", ["ttft_over_slo", "ttft_p95_over_slo", "itl_over_slo",
                                                 "itl_p95_over_slo"],
                 out_dir / "latency_breakdown.png", "latency / SLO threshold")
    figures.bars(tables["ablation"], "system", ["attainment_pct"], out_dir / "ablation.png", "mean SLO attainment %")
    figures.sensitivity(tables["sensitivity"], out_dir / "sensitivity.png")
    text = "".join(f"## {name}\n\n{markdown_table(rows)}\n" for name, rows in tables.items())
    (out_dir / "tables.md").write_text(text)
    return tables
