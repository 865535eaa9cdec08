"""The figures' layout, checked on what matplotlib laid out (not on pixels): every
text inside the figure, legends off the data, one (colour, line style) per
series, integer ticks on an integer axis."""

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_rgba
from matplotlib.legend import Legend
from matplotlib.text import Text

from ampd.metrics.plot import plot_attainment
from ampd.reproduce import figures
from ampd.reproduce.report import summarize

SYSTEMS = ("ampd", "ampd-predictive", "pd-disagg", "dynamo-length", "dynamo-busy", "dynamo-conditional", "vllm",
           "vllm-chunked", "continuum", "ampd [planner]", "ampd-predictive [planner]")
CELLS = (("Llama-3.1-70B", "toolbench", 8), ("Llama-3.1-70B", "gaia", 32), ("Mixtral-8x7B", "toolbench", 8),
         ("Mixtral-8x7B", "gaia", 32))
FRACTIONS = (0.5, 1.0, 1.5)


def _row(model, workload, gpus, system, fraction, **extra):
    """A grid row as ``run_points`` writes it: every system unstable at 1.5 x the
    reference (so their crosses share a rate), the rest stable."""
    cell = f"{model} / {workload} / {gpus} GPUs"
    return {"cell": cell, "model": model, "workload": workload, "num_gpus": gpus, "system": system,
            "rate_fraction": fraction, "rate_per_s": fraction, "scope": "mean",
            "slo_attainment": 1.0 - 0.2 * fraction, "verdict": "unstable" if fraction == 1.5 else "stable",
            "ttft_mean_s": 0.5, "ttft_p95_s": 1.0, "ttft_slo_s": 1.0, "itl_mean_s": 0.03, "itl_p95_s": 0.04,
            "itl_slo_s": 0.05, "local_prefill_share": 0.1, "deployment": "P:<TP=4,DP=1> D:<TP=4,DP=1>", **extra}


def _results() -> dict:
    grid_rows = [_row(*c, s, f) for c in CELLS for s in SYSTEMS for f in FRACTIONS]
    capacities = [{"cell": f"{m} / {w} / {g} GPUs", "system": s, "num_gpus": g, "capacity_per_s": 1.1,
                   "capacity_per_gpu": 1.1 / g, "reference_per_s": 1.0} for m, w, g in CELLS for s in SYSTEMS]
    ablation = [_row(*c, s, f) for c in CELLS for s in ("ampd", "ampd-no-reorder", "pd-disagg") for f in FRACTIONS]
    sensitivity = [_row(*c, "ampd", 1.0, knob=k, value=v) for c in CELLS
                   for k, values in {"reorder_window": (2, 3, 5), "alpha": (0.7, 0.9), "beta": (0.7, 0.85)}.items()
                   for v in values]
    return {"grid": grid_rows, "capacities": capacities, "ablation": ablation,
            "ablation_capacities": [c for c in capacities if c["system"] in ("ampd", "pd-disagg")],
            "sensitivity": sensitivity, "best_deployments": [],
            "references": [{"cell": f"{m} / {w} / {g} GPUs", "reference_per_s": 1.0, "met_slo": True}
                           for m, w, g in CELLS]}


@pytest.fixture
def drawn(monkeypatch):
    """The figures drawn while the test runs, kept open (the plotting functions
    close them once saved, after which they can still be measured)."""
    kept, close = [], plt.close
    monkeypatch.setattr(plt, "close", kept.append)
    yield kept
    for fig in kept:
        close(fig)


def _check_layout(fig) -> None:
    """Everything drawn inside the figure (titles, tick labels, legends); no
    legend over any axes or title."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    drawn = fig.get_tightbbox(renderer)  # inches, of what is drawn (not of ticks outside the view)
    width, height = fig.get_size_inches()
    assert drawn.x0 >= -0.01 and drawn.y0 >= -0.01 and drawn.x1 <= width + 0.01 and drawn.y1 <= height + 0.01
    suptitle = [t for t in fig.findobj(Text) if fig.get_suptitle() and t.get_text() == fig.get_suptitle()]
    for text in [*suptitle, *(ax.title for ax in fig.axes), *(t for lg in fig.legends for t in lg.get_texts())]:
        if text.get_text():
            assert fig.bbox.contains(*text.get_window_extent(renderer).min) and \
                fig.bbox.contains(*text.get_window_extent(renderer).max), f"{text.get_text()!r} leaves the figure"
    titles = [*suptitle, *(ax.title for ax in fig.axes if ax.get_title())]
    for legend in fig.findobj(Legend):
        for ax in fig.axes:
            assert not legend.get_window_extent(renderer).overlaps(ax.get_window_extent(renderer)), \
                "a legend is drawn over an axes"
        for title in titles:
            assert not legend.get_window_extent(renderer).overlaps(title.get_window_extent(renderer)), \
                f"a legend is drawn over {title.get_text()!r}"


def _styles(handles) -> list[tuple]:
    return [(to_rgba(h.get_color()), h.get_linestyle()) for h in handles]


def test_reproduce_figures_lay_out_whole(tmp_path, drawn):
    tables = summarize(_results())
    what = figures.describe(_results()["grid"])
    calls = {
        "attainment_grid": lambda p: figures.attainment_grid(_results()["grid"], _results()["capacities"], p),
        "capacity": lambda p: figures.capacity_bars(_results()["capacities"], p, what),
        "latency_breakdown": lambda p: figures.bars(tables["breakdown"], "system",
                                                    ["ttft_over_slo", "itl_over_slo"], p, "latency / SLO threshold",
                                                    f"Latency\n{what}"),
        "ablation": lambda p: figures.bars(tables["ablation"], "system", ["capacity_over_reference"], p,
                                           "capacity / reference capacity", f"Ablation, a long title\n{what}"),
        "sensitivity": lambda p: figures.sensitivity(tables["sensitivity"], p, what)}
    for name, draw in calls.items():
        draw(tmp_path / f"{name}.png")
        _check_layout(drawn[-1])
        assert (tmp_path / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    assert "Llama-3.1-70B, Mixtral-8x7B on H20 GPUs" in what and "gaia on 32" in what and "mean scope" in what


def test_attainment_grid_one_style_per_system_planner_dashed_in_its_colour(tmp_path, drawn):
    results = _results()
    figures.attainment_grid(results["grid"], results["capacities"], tmp_path / "grid.png")
    (legend,) = drawn[-1].legends
    labels = [t.get_text() for t in legend.get_texts()]
    series = dict(zip(labels, _styles(legend.legend_handles)))
    systems = {label.split(" (")[0]: style for label, style in series.items() if label.split(" (")[0] in SYSTEMS}
    assert set(systems) == set(SYSTEMS)
    assert len(set(systems.values())) == len(SYSTEMS)  # no two systems look alike
    bases = {s for s in SYSTEMS if not s.endswith("[planner]")}
    assert len({colour for colour, _ in (systems[s] for s in bases)}) == len(bases)
    for planned in ("ampd", "ampd-predictive"):
        assert systems[f"{planned} [planner]"] == (systems[planned][0], "--")
        assert systems[planned][1] == "-"
    assert any("dashed" in label for label in labels)
    titles = {ax.get_title() for ax in drawn[-1].axes} - {""}
    assert "Mixtral-8x7B on 32 x H20, gaia, mean scope" in titles
    # Every curve drawn in a panel is one of the legend's styles.
    for ax in drawn[-1].axes:
        for line in ax.get_lines():
            if line.get_marker() == "o":
                assert (to_rgba(line.get_color()), line.get_linestyle()) in systems.values()


def test_unstable_crosses_at_one_rate_do_not_hide_one_another(tmp_path, drawn):
    results = _results()
    figures.attainment_grid(results["grid"], results["capacities"], tmp_path / "grid.png")
    for ax in drawn[-1].axes:
        crosses = [(x, y) for line in ax.get_lines() if line.get_marker() == "x"
                   for x, y in zip(line.get_xdata(), line.get_ydata())]
        assert len(crosses) == len(set(crosses))
    strips = [ax for ax in drawn[-1].axes if any(line.get_marker() == "x" for line in ax.get_lines())]
    assert len(strips) == len(CELLS)
    assert all(len(ax.get_lines()) == len(SYSTEMS) for ax in strips)  # every system unstable at 1.5: one row each


def test_sensitivity_integer_knob_has_integer_ticks_and_a_title(tmp_path, drawn):
    tables = summarize(_results())
    figures.sensitivity(tables["sensitivity"], tmp_path / "s.png", figures.describe(_results()["grid"]))
    fig = drawn[-1]
    fig.canvas.draw()
    (window,) = [ax for ax in fig.axes if ax.get_xlabel().startswith("w ")]
    ticks = list(window.get_xticks())
    assert ticks == [2, 3, 5]
    assert all(float(t).is_integer() for t in ticks)
    assert [t.get_text() for t in window.get_xticklabels()] == ["2", "3", "5"]
    assert not window.xaxis.get_minorticklocs().size
    title = fig.get_suptitle()
    assert "w, α, β" in title and "Llama-3.1-70B" in title and "H20" in title and "toolbench on 8" in title


def test_sweep_plot_legend_outside_and_title_whole(tmp_path, drawn):
    rows = [{"workload": w, "system": s, "rate_per_s": r, "slo_attainment": 0.9, "scope": "mean",
             "verdict": "unstable" if r > 1 else "stable"}
            for w in ("builtin:mooncake-conversation", "toolbench") for s in ("ampd", "ampd-predictive", "pd-disagg")
            for r in (0.5, 1.0, 1.5, 2.0)]
    title = "Llama-3.1-70B on 8 x H20\nbuiltin:mooncake-conversation: SLO TTFT 22.66 s, ITL 68 ms (mean), Poisson arrivals"
    plot_attainment(rows, tmp_path / "sweep.png", title, {("toolbench", "ampd"): 0.8})
    fig = drawn[-1]
    _check_layout(fig)
    (legend,) = fig.legends
    styles = _styles(h for h, t in zip(legend.legend_handles, legend.get_texts())
                     if t.get_text() in ("ampd", "ampd-predictive", "pd-disagg"))
    assert len(styles) == 3 and len(set(styles)) == 3
    for ax in fig.axes:
        crosses = [(x, y) for line in ax.get_lines() if line.get_marker() == "x"
                   for x, y in zip(line.get_xdata(), line.get_ydata())]
        assert len(crosses) == len(set(crosses))
