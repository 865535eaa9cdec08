"""Figures of ``ampd reproduce`` (matplotlib, headless PNG)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from ampd.measure import STABLE  # noqa: E402
from ampd.metrics.plot import steady_segments  # noqa: E402


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _colours(systems: Sequence[str]) -> dict[str, tuple]:
    """One distinct colour per system; a ``[planner]`` variant shares its system's
    colour (and is drawn dashed)."""
    bases = list(dict.fromkeys(s.removesuffix(" [planner]") for s in systems))
    return {s: plt.cm.tab10(bases.index(s.removesuffix(" [planner]")) % 10) for s in systems}


def attainment_grid(rows: Sequence[dict], capacities: Sequence[dict], path: Path) -> None:
    """SLO attainment against rate, one panel per cell (models down, workloads
    across): steady-state points joined, unstable rates as crosses on the rate
    axis (no figure), each system's capacity as a dotted vertical line; one
    legend for the figure."""
    cells = list(dict.fromkeys(r["cell"] for r in rows))
    models = list(dict.fromkeys(c.split(" / ")[0] for c in cells))
    workloads = list(dict.fromkeys(c.split(" / ")[1] for c in cells))
    systems = list(dict.fromkeys(r["system"] for r in rows))
    colours = _colours(systems)
    capacity = {(r["cell"], r["system"]): r["capacity_per_s"] for r in capacities}
    fig, axes = plt.subplots(len(models), len(workloads), figsize=(4.2 * len(workloads), 3.2 * len(models) + 1.2),
                             squeeze=False)
    for cell in cells:
        model, workload = cell.split(" / ")[:2]
        ax = axes[models.index(model)][workloads.index(workload)]
        for system in systems:
            pts = sorted((r["rate_per_s"], 100 * r["slo_attainment"], r["verdict"]) for r in rows
                         if r["cell"] == cell and r["system"] == system)
            dashed = "--" if system.endswith("[planner]") else "-"
            for i, segment in enumerate(steady_segments(pts)):
                ax.plot([p[0] for p in segment], [p[1] for p in segment], dashed, marker="o", ms=3,
                        label=system if i == 0 else None, color=colours[system])
            unstable = [x for x, _, v in pts if v != STABLE]
            ax.plot(unstable, [0.0] * len(unstable), "x", ms=4, color=colours[system], alpha=0.6, clip_on=False)
            if capacity.get((cell, system)):
                ax.axvline(capacity[(cell, system)], color=colours[system], linestyle=":", linewidth=1)
        ax.set_title(cell, fontsize=9)
        ax.set_xlabel("sessions/s", fontsize=8)
        ax.set_ylabel("SLO attainment %", fontsize=8)
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles += [plt.Line2D([], [], marker="x", linestyle="", color="grey"),
                plt.Line2D([], [], linestyle=":", color="grey")]
    labels += ["unstable (overloaded)", "capacity (>= 90 %, steady)"]
    fig.legend(handles, labels, loc="lower center", ncol=min(7, len(labels)), fontsize=8)
    fig.tight_layout(rect=(0, 1.0 / (3.2 * len(models) + 1.2), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def capacity_bars(capacities: Sequence[dict], path: Path) -> None:
    """Each system's capacity over its cell's reference (plain PD disaggregation
    on an even split), one group of bars per cell."""
    cells = list(dict.fromkeys(r["cell"] for r in capacities))
    systems = list(dict.fromkeys(r["system"] for r in capacities))
    colours = _colours(systems)
    ratio = {(r["cell"], r["system"]): r["capacity_per_s"] / r["reference_per_s"] for r in capacities}
    fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(cells)), 4.2))
    width = 0.85 / len(systems)
    for i, system in enumerate(systems):
        ax.bar([x + i * width for x in range(len(cells))], [ratio.get((c, system), 0.0) for c in cells], width,
               label=system, color=colours[system], hatch="//" if system.endswith("[planner]") else None)
    ax.set_xticks([x + width * (len(systems) - 1) / 2 for x in range(len(cells))])
    ax.set_xticklabels([c.replace(" / ", "\n", 1) for c in cells], fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("capacity / reference capacity")
    ax.set_title("Capacity (highest rate with >= 90 % SLO attainment in steady state)", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    _save(fig, path)


LEGEND = {"ttft_over_slo": "mean TTFT / threshold", "ttft_p95_over_slo": "P95 TTFT / threshold",
          "itl_over_slo": "mean ITL / threshold", "itl_p95_over_slo": "P95 ITL / threshold",
          "attainment_pct": "mean SLO attainment %", "capacity_over_reference": "capacity / reference"}


def bars(table: Sequence[dict], label: str, columns: Sequence[str], path: Path, ylabel: str, title: str) -> None:
    """Grouped bars: one group per row of ``table`` (named by ``label``), one bar per column."""
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(table)), 3.8))
    width = 0.8 / len(columns)
    for i, column in enumerate(columns):
        ax.bar([x + i * width for x in range(len(table))], [row[column] for row in table], width,
               label=LEGEND.get(column, column))
    ax.set_xticks([x + width * (len(columns) - 1) / 2 for x in range(len(table))])
    ax.set_xticklabels([str(row[label]) for row in table], rotation=20, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def sensitivity(table: Sequence[dict], path: Path) -> None:
    """Mean attainment (over the cells stable at every value of the knob) against
    each knob's value, one panel per knob; ticks at the values tried."""
    knobs = list(dict.fromkeys(r["knob"] for r in table))
    fig, axes = plt.subplots(1, len(knobs), figsize=(4 * len(knobs), 3.4), squeeze=False)
    for ax, knob in zip(axes[0], knobs):
        pts = sorted((r["value"], r["attainment_pct"]) for r in table if r["knob"] == knob)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
        ax.set_xticks([p[0] for p in pts])
        ax.set_xlabel(knob)
        ax.set_ylabel("mean SLO attainment %")
        ax.set_ylim(0, 100)
        ax.grid(alpha=0.3)
    fig.suptitle("AMPD's sensitivity to w, alpha and beta (at the reference capacity; cells stable at every value)",
                 fontsize=10)
    _save(fig, path)
