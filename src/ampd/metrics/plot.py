"""Plots of sweep results (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)


def plot_attainment(rows: Sequence[dict], path: Path, title: str = "") -> None:
    """SLO attainment (%) against arrival rate, one panel per workload and one
    line per system; written as PNG to ``path``."""
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    systems = list(dict.fromkeys(r["system"] for r in rows))
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 3.8), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        for system in systems:
            pts = sorted((r["rate_per_s"], 100 * r["slo_attainment"]) for r in rows
                         if r["workload"] == workload and r["system"] == system)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=system)
        scope = next(r["scope"] for r in rows if r["workload"] == workload)
        ax.set_title(f"{workload}")
        ax.set_xlabel("session arrival rate (sessions/s)")
        ax.set_ylabel(f"SLO attainment (%, {scope} scope)")
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
