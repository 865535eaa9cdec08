"""Plots of sweep results (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.lines import Line2D  # noqa: E402


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


STRIP_ROW_IN = 0.11  # height of one system's row of unstable crosses, inches


def panel_with_strip(fig, spec, panel_in: float, num_systems: int):
    """A panel (``panel_in`` inches high) and under it its strip of unstable
    rates (``unstable_strip``), in ``spec`` (one cell of a gridspec); they share
    the rate axis, labelled under the strip only."""
    strip_in = 0.1 + STRIP_ROW_IN * num_systems
    inner = spec.subgridspec(2, 1, height_ratios=[panel_in, strip_in])
    ax = fig.add_subplot(inner[0])
    strip = fig.add_subplot(inner[1], sharex=ax)
    ax.tick_params(axis="x", labelbottom=False)
    return ax, strip


def unstable_strip(ax, systems: Sequence[str], unstable: Mapping[str, Sequence[float]], colours: Mapping[str, object],
                   names: bool) -> None:
    """A cross at each rate where a system's run was unstable (overloaded), one
    row per system in legend order: on the panel itself, the crosses of several
    systems at one rate would hide one another. ``names`` labels the rows (the
    first panel of a row; the others keep the same order)."""
    for row, system in enumerate(systems):
        rates = unstable.get(system, ())
        if rates:  # an empty line still claims the axes' data limits
            ax.plot(rates, [row] * len(rates), "x", ms=4, color=colours[system])
    ax.set_ylim(len(systems) - 0.5, -0.5)  # first system on top, as in the legend
    ax.set_yticks(range(len(systems)), systems if names else [], fontsize=7)
    ax.tick_params(axis="y", length=0)
    if names:
        ax.set_ylabel("unstable", fontsize=8)
    ax.grid(axis="x", alpha=0.3)


def plot_attainment(rows: Sequence[dict], path: Path, title: str = "",
                    capacities: Mapping[tuple[str, str], float] | None = None) -> None:
    """SLO attainment (%) against arrival rate, one panel per workload and one
    colour per system, written as PNG to ``path``. Steady-state points are filled
    and joined; an unstable (overloaded) rate is a cross in the strip under the
    panel (its run's attainment is not a figure, so it is not drawn as one),
    never joined to the curve; a transient run's points are joined by a dashed
    line. ``capacities`` ((workload, system) -> sessions/s) adds a dotted
    vertical line at each system's capacity."""
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    systems = list(dict.fromkeys(r["system"] for r in rows))
    colours = {s: f"C{i % 10}" for i, s in enumerate(systems)}
    panel_in = 3.6
    # Constrained layout keeps a title of several lines, the strips and the legend
    # below the panels from squeezing or clipping one another.
    fig = plt.figure(figsize=(5.5 * len(workloads), panel_in + STRIP_ROW_IN * len(systems) + 1.6
                              + 0.2 * title.count("\n")), layout="constrained")
    specs = fig.add_gridspec(1, len(workloads))
    for column, workload in enumerate(workloads):
        ax, strip = panel_with_strip(fig, specs[0, column], panel_in, len(systems))
        unstable = {}
        for system in systems:
            pts = sorted((r["rate_per_s"], 100 * r["slo_attainment"], r.get("verdict", "stable")) for r in rows
                         if r["workload"] == workload and r["system"] == system)
            style = "--" if any(v == "transient" for _, _, v in pts) else "-"
            for i, segment in enumerate(steady_segments(pts)):
                ax.plot([p[0] for p in segment], [p[1] for p in segment], style, marker="o", color=colours[system],
                        label=system if i == 0 else None)
            unstable[system] = [x for x, _, v in pts if v == "unstable"]
            capacity = (capacities or {}).get((workload, system))
            if capacity:
                ax.axvline(capacity, color=colours[system], linestyle=":", linewidth=1.2)
        unstable_strip(strip, systems, unstable, colours, names=column == 0)
        scope = next(r["scope"] for r in rows if r["workload"] == workload)
        ax.set_title(workload, fontsize=10)
        strip.set_xlabel("session arrival rate (sessions/s)")
        ax.set_ylabel(f"SLO attainment (%, {scope} scope)")
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    # One legend for every panel, outside them, so it never covers a point; a system
    # missing from the last panel still gets its entry.
    labelled = {label: handle for a in fig.axes for handle, label in zip(*a.get_legend_handles_labels())}
    labelled["unstable (overloaded): strip under each panel"] = Line2D([], [], marker="x", linestyle="", color="grey")
    if capacities:
        labelled["capacity"] = Line2D([], [], linestyle=":", color="grey")
    fig.legend(labelled.values(), labelled.keys(), loc="outside lower center", ncol=min(6, len(labelled)),
               fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
