"""Figures of ``ampd reproduce`` (matplotlib, headless PNG)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def attainment_grid(rows: Sequence[dict], path: Path) -> None:
    """SLO attainment against rate, one panel per cell (models down, workloads across)."""
    cells = list(dict.fromkeys(r["cell"] for r in rows))
    models = list(dict.fromkeys(c.split(" / ")[0] for c in cells))
    workloads = list(dict.fromkeys(c.split(" / ")[1] for c in cells))
    systems = list(dict.fromkeys(r["system"] for r in rows))
    fig, axes = plt.subplots(len(models), len(workloads), figsize=(4.2 * len(workloads), 3.2 * len(models)),
                             squeeze=False)
    for cell in cells:
        model, workload = cell.split(" / ")[:2]
        ax = axes[models.index(model)][workloads.index(workload)]
        for i, system in enumerate(systems):
            pts = sorted((r["rate_per_s"], 100 * r["slo_attainment"]) for r in rows
                         if r["cell"] == cell and r["system"] == system)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=system,
                    color=plt.cm.tab20(i % 20), linestyle="--" if "[planner]" in system else "-")
        ax.set_title(cell, fontsize=9)
        ax.set_xlabel("sessions/s", fontsize=8)
        ax.set_ylabel("SLO attainment %", fontsize=8)
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    _save(fig, path)


LEGEND = {"ttft_over_slo": "mean TTFT / threshold", "ttft_p95_over_slo": "P95 TTFT / threshold",
          "itl_over_slo": "mean ITL / threshold", "itl_p95_over_slo": "P95 ITL / threshold",
          "attainment_pct": "mean SLO attainment %"}


def bars(table: Sequence[dict], label: str, columns: Sequence[str], path: Path, ylabel: str) -> None:
    """Grouped bars: one group per row of ``table`` (named by ``label``), one bar per column."""
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(table)), 3.6))
    width = 0.8 / len(columns)
    for i, column in enumerate(columns):
        ax.bar([x + i * width for x in range(len(table))], [row[column] for row in table], width,
               label=LEGEND.get(column, column))
    ax.set_xticks([x + width * (len(columns) - 1) / 2 for x in range(len(table))])
    ax.set_xticklabels([str(row[label]) for row in table], rotation=20, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def sensitivity(table: Sequence[dict], path: Path) -> None:
    """Mean attainment against each knob's value, one panel per knob."""
    knobs = list(dict.fromkeys(r["knob"] for r in table))
    fig, axes = plt.subplots(1, len(knobs), figsize=(4 * len(knobs), 3.2), squeeze=False)
    for ax, knob in zip(axes[0], knobs):
        pts = sorted((r["value"], r["attainment_pct"]) for r in table if r["knob"] == knob)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
        ax.set_xlabel(knob)
        ax.set_ylabel("mean SLO attainment %")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
    _save(fig, path)
