"""Plots of sweep results (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)


def steady_segments(points: Sequence[tuple[float, float, str]]) -> list[list[tuple[float, float]]]:
    """Runs of consecutive (rate, attainment, verdict) points that are not unstable,
    in rate order: a curve is drawn through each run, never across an unstable
    point (nothing is known of the attainment there)."""
    segments: list[list[tuple[float, float]]] = [[]]
    for x, y, verdict in sorted(points):
        if verdict == "unstable":
            segments.append([])
        else:
            segments[-1].append((x, y))
    return [s for s in segments if s]


def plot_attainment(rows: Sequence[dict], path: Path, title: str = "",
                    capacities: Mapping[tuple[str, str], float] | None = None) -> None:
    """SLO attainment (%) against arrival rate, one panel per workload and one
    colour per system, written as PNG to ``path``. Steady-state points are filled
    and joined; an unstable (overloaded) rate is a cross on the rate axis (its
    run's attainment is not a figure, so it is not drawn as one), never joined to
    the curve; a transient run's points are joined by a dashed line. ``capacities`` ((workload, system) -> sessions/s)
    adds a dotted vertical line at each system's capacity."""
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    systems = list(dict.fromkeys(r["system"] for r in rows))
    colours = {s: f"C{i % 10}" for i, s in enumerate(systems)}
    # Constrained layout keeps a title of several lines and the legend below the panels
    # from squeezing or clipping them.
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4.4 + 0.2 * title.count("\n")),
                             squeeze=False, layout="constrained")
    for ax, workload in zip(axes[0], workloads):
        for system in systems:
            pts = sorted((r["rate_per_s"], 100 * r["slo_attainment"], r.get("verdict", "stable")) for r in rows
                         if r["workload"] == workload and r["system"] == system)
            style = "--" if any(v == "transient" for _, _, v in pts) else "-"
            for i, segment in enumerate(steady_segments(pts)):
                ax.plot([p[0] for p in segment], [p[1] for p in segment], style, marker="o", color=colours[system],
                        label=system if i == 0 else None)
            unstable = [x for x, _, v in pts if v == "unstable"]
            if unstable:  # an empty unclipped line still claims the figure's origin and collapses the layout
                ax.plot(unstable, [0.0] * len(unstable), "x", color=colours[system], alpha=0.7, clip_on=False)
            capacity = (capacities or {}).get((workload, system))
            if capacity:
                ax.axvline(capacity, color=colours[system], linestyle=":", linewidth=1.2)
        scope = next(r["scope"] for r in rows if r["workload"] == workload)
        ax.set_title(workload, fontsize=10)
        ax.set_xlabel("session arrival rate (sessions/s)")
        ax.set_ylabel(f"SLO attainment (%, {scope} scope)")
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    ax.plot([], [], "x", color="grey", label="unstable (overloaded)")
    if capacities:
        ax.plot([], [], ":", color="grey", label="capacity")
    # One legend for every panel, outside them, so it never covers a point; a system
    # missing from the last panel still gets its entry.
    labelled = {label: handle for a in axes[0] for handle, label in zip(*a.get_legend_handles_labels())}
    fig.legend(labelled.values(), labelled.keys(), loc="outside lower center", ncol=min(6, len(labelled)),
               fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
