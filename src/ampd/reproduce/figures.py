"""Figures of ``ampd reproduce`` (matplotlib, headless PNG)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.lines import Line2D  # noqa: E402

from ampd.measure import STABLE  # noqa: E402
from ampd.metrics.plot import STRIP_ROW_IN, panel_with_strip, steady_segments, unstable_strip  # noqa: E402
from ampd.policy.systems import Knobs  # noqa: E402
from ampd.reproduce.grid import GPU, PLANNED  # noqa: E402

# Every figure is drawn with constrained layout, which makes room for titles, tick
# labels and legends placed outside the axes ("outside ..." locations), so nothing
# is clipped or drawn over the data.


def _wrapped(title: str, width_in: float, fontsize: float) -> str:
    """``title`` with each line folded to the figure's width: constrained layout
    makes room above the axes for a title but never narrows one wider than the
    figure, which is then clipped at both ends."""
    chars = int(width_in * 72 / (0.6 * fontsize))  # 0.6 em: a wide average glyph, so folding errs early
    return "\n".join(textwrap.fill(line, chars) for line in title.split("\n"))


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _ordered(systems: Sequence[str]) -> list[str]:
    """Systems in first-seen order, each ``[planner]`` variant right after its
    system, so the legend (and the strips' rows) pair them."""
    bases = list(dict.fromkeys(s.removesuffix(PLANNED) for s in systems))
    return sorted(dict.fromkeys(systems), key=lambda s: (bases.index(s.removesuffix(PLANNED)), s.endswith(PLANNED)))


def _colours(systems: Sequence[str]) -> dict[str, tuple]:
    """One distinct colour per system; a ``[planner]`` variant shares its system's
    colour (and is told apart by its line style or hatching)."""
    bases = list(dict.fromkeys(s.removesuffix(PLANNED) for s in systems))
    return {s: plt.cm.tab10(bases.index(s.removesuffix(PLANNED)) % 10) for s in systems}


def describe(rows: Sequence[dict]) -> str:
    """What the rows ran: models, GPUs per workload, scope (one line, for titles)."""
    models = ", ".join(dict.fromkeys(r["model"] for r in rows))
    gpus = ", ".join(f"{w} on {n}" for w, n in dict.fromkeys((r["workload"], r["num_gpus"]) for r in rows))
    scopes = ", ".join(dict.fromkeys(r["scope"] for r in rows))
    return f"{models} on {GPU} GPUs: {gpus}; SLO attainment in {scopes} scope"


def _cell_title(cell: str, rows: Sequence[dict]) -> str:
    row = next(r for r in rows if r["cell"] == cell)
    return f"{row['model']} on {row['num_gpus']} x {GPU}, {row['workload']}, {row['scope']} scope"


def attainment_grid(rows: Sequence[dict], capacities: Sequence[dict], path: Path) -> None:
    """SLO attainment against rate, one panel per cell (models down, workloads
    across): steady-state points joined, solid on the searched deployment and
    dashed on the planner's; unstable rates as crosses in a strip under the
    panel (no figure); each system's capacity as a dotted vertical line; one
    legend below the grid."""
    cells = list(dict.fromkeys(r["cell"] for r in rows))
    models = list(dict.fromkeys(c.split(" / ")[0] for c in cells))
    workloads = list(dict.fromkeys(c.split(" / ")[1] for c in cells))
    systems = _ordered([r["system"] for r in rows])
    colours = _colours(systems)
    capacity = {(r["cell"], r["system"]): r["capacity_per_s"] for r in capacities}
    panel_in = 3.0
    fig = plt.figure(figsize=(4.6 * len(workloads), (panel_in + STRIP_ROW_IN * len(systems) + 1.1) * len(models) + 1.6),
                     layout="constrained")
    specs = fig.add_gridspec(len(models), len(workloads))
    for cell in cells:
        model, workload = cell.split(" / ")[:2]
        column = workloads.index(workload)
        ax, strip = panel_with_strip(fig, specs[models.index(model), column], panel_in, len(systems))
        unstable = {}
        for system in systems:
            pts = sorted((r["rate_per_s"], 100 * r["slo_attainment"], r["verdict"]) for r in rows
                         if r["cell"] == cell and r["system"] == system)
            style = "--" if system.endswith(PLANNED) else "-"
            for segment in steady_segments(pts):
                ax.plot([p[0] for p in segment], [p[1] for p in segment], style, marker="o", ms=3,
                        color=colours[system])
            unstable[system] = [x for x, _, v in pts if v != STABLE]
            if capacity.get((cell, system)):
                ax.axvline(capacity[(cell, system)], color=colours[system], linestyle=":", linewidth=1)
        unstable_strip(strip, systems, unstable, colours, names=column == 0)
        ax.set_title(_cell_title(cell, rows), fontsize=9)
        strip.set_xlabel("session arrival rate (sessions/s)", fontsize=8)
        ax.set_ylabel("SLO attainment %", fontsize=8)
        ax.set_ylim(-3, 103)
        ax.grid(alpha=0.3)
    # Handles built here, not read from one panel: a system absent from a panel still
    # has its entry.
    handles = [Line2D([], [], linestyle="--" if s.endswith(PLANNED) else "-", marker="o", ms=3, color=colours[s])
               for s in systems]
    labels = [f"{s} (dashed)" if s.endswith(PLANNED) else s for s in systems]
    handles += [Line2D([], [], marker="x", linestyle="", color="grey"), Line2D([], [], linestyle=":", color="grey")]
    labels += ["unstable (overloaded)", "capacity (>= 90 %)"]
    # As many columns as panels: the legend is then no wider than the grid.
    fig.legend(handles, labels, loc="outside lower center", ncol=max(2, len(workloads)), fontsize=8,
               title="solid: on the best searched deployment; dashed [planner]: on the planner's deployment;\n"
                     "unstable rates: a cross in the strip under each panel, one row per system",
               title_fontsize=8)
    fig.suptitle("SLO attainment against session arrival rate, steady state", fontsize=11)
    _save(fig, path)


def capacity_bars(capacities: Sequence[dict], path: Path, what: str) -> None:
    """Each system's capacity over its cell's reference (plain PD disaggregation
    on an even split), one group of bars per cell; ``what`` (``describe``) is the
    title's second line."""
    cells = list(dict.fromkeys(r["cell"] for r in capacities))
    systems = _ordered([r["system"] for r in capacities])
    colours = _colours(systems)
    ratio = {(r["cell"], r["system"]): r["capacity_per_s"] / r["reference_per_s"] for r in capacities}
    fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(cells)), 5.2), layout="constrained")
    width = 0.85 / len(systems)
    for i, system in enumerate(systems):
        ax.bar([x + i * width for x in range(len(cells))], [ratio.get((c, system), 0.0) for c in cells], width,
               label=f"{system} (hatched)" if system.endswith(PLANNED) else system,
               color=colours[system], hatch="//" if system.endswith(PLANNED) else None)
    ax.set_xticks([x + width * (len(systems) - 1) / 2 for x in range(len(cells))])
    model_gpus = {r["cell"]: (r["cell"].split(" / ")[0], r["cell"].split(" / ")[1], r["num_gpus"]) for r in capacities}
    ax.set_xticklabels([f"{m}\n{w}, {n} x {GPU}" for m, w, n in (model_gpus[c] for c in cells)], fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("capacity / reference capacity")
    fig.suptitle(_wrapped("Capacity (highest rate with >= 90 % SLO attainment in steady state) over the cell's "
                          f"reference (plain PD disaggregation, even split)\n{what}", fig.get_figwidth(), 10),
                 fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    # Below the bars, as many columns as fit the figure's width (an entry is at most
    # about 2.4 inches wide at this size).
    fig.legend(loc="outside lower center", ncol=max(1, int(fig.get_figwidth() / 2.4)), fontsize=8,
               title="hatched [planner]: on the planner's deployment", title_fontsize=8)
    _save(fig, path)


LEGEND = {"ttft_over_slo": "mean TTFT / threshold", "ttft_p95_over_slo": "P95 TTFT / threshold",
          "itl_over_slo": "mean ITL / threshold", "itl_p95_over_slo": "P95 ITL / threshold",
          "attainment_pct": "mean SLO attainment %", "capacity_over_reference": "capacity / reference"}


def bars(table: Sequence[dict], label: str, columns: Sequence[str], path: Path, ylabel: str, title: str) -> None:
    """Grouped bars: one group per row of ``table`` (named by ``label``), one bar
    per column; a legend (below the axes) only when there are several columns,
    one column being named by ``ylabel``."""
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(table)), 4.2), layout="constrained")
    width = 0.8 / len(columns)
    for i, column in enumerate(columns):
        ax.bar([x + i * width for x in range(len(table))], [row[column] for row in table], width,
               label=LEGEND.get(column, column))
    ax.set_xticks([x + width * (len(columns) - 1) / 2 for x in range(len(table))])
    ax.set_xticklabels([str(row[label]) for row in table], rotation=20, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(_wrapped(title, fig.get_figwidth(), 10), fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    if len(columns) > 1:
        fig.legend(loc="outside lower center", ncol=len(columns), fontsize=8)
    _save(fig, path)


KNOBS = {"reorder_window": "w", "alpha": "α", "beta": "β"}  # the paper's names


def sensitivity(table: Sequence[dict], path: Path, what: str) -> None:
    """Mean attainment (over the cells stable at every value of the knob) against
    each knob's value, one panel per knob; ticks at the values tried, written as
    integers on an integer knob (w); ``what`` (``describe``) is the title's
    second line."""
    knobs = list(dict.fromkeys(r["knob"] for r in table))
    fig, axes = plt.subplots(1, len(knobs), figsize=(4.4 * len(knobs), 4.0), squeeze=False, layout="constrained")
    for ax, knob in zip(axes[0], knobs):
        group = [r for r in table if r["knob"] == knob]
        pts = sorted((r["value"], r["attainment_pct"]) for r in group)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
        values = [p[0] for p in pts]
        integer = all(float(v).is_integer() for v in values)  # w: never a tick at 2.5
        ax.set_xticks(values, [f"{v:.0f}" for v in values] if integer else None)
        ax.set_xlabel(f"{KNOBS.get(knob, knob)} ({knob})")
        ax.set_ylabel("mean SLO attainment %")
        ax.set_ylim(0, 100)
        ax.set_title(f"{group[0]['common_stable_cells']} of {group[0]['num_cells']} cells stable at every value",
                     fontsize=9)
        ax.grid(alpha=0.3)
    held = ", ".join(f"{KNOBS.get(k, k)} = {getattr(Knobs(), k):g}" for k in knobs)
    fig.suptitle(_wrapped(f"AMPD's sensitivity to {', '.join(KNOBS.get(k, k) for k in knobs)}, one varied at a time "
                          f"(otherwise {held}), at each cell's reference capacity\n{what}", fig.get_figwidth(), 10),
                 fontsize=10)
    _save(fig, path)
