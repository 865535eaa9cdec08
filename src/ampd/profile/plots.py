"""A profile's plots: every measured point against the fitted function, held-out
points marked, one PNG per function."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.ticker import NullFormatter, ScalarFormatter  # noqa: E402

from ampd.metrics.records import SessionRecord  # noqa: E402
from ampd.profile.fit import FitResult, medians  # noqa: E402
from ampd.profile.run import Measurements, decode_medians  # noqa: E402

# One curve: (label, [(x, cost arguments, measured seconds)]).
Curve = tuple[str, list[tuple[int, tuple[int, int], float]]]


def plot_profile(points: Measurements, fits: dict[str, Any], title: str, out_dir: Path) -> list[Path]:
    """``prefill.png``, ``decode.png`` and (when measured) ``kv.png`` and ``remote.png`` in ``out_dir``:
    times in ms on log axes, measured points as markers (hollow: held out of the fit),
    the fit as a line through the same sizes. Returns the paths written."""
    prefill: dict[int, list] = {}
    for h, n, t in medians([(p.hist_tokens, p.new_tokens, p.time_s) for p in points.prefill]):
        prefill.setdefault(h, []).append((n, (h, n), t))
    decode: dict[int, list] = {}
    for (b, prompt), (ctx, t) in decode_medians(points.decode).items():
        decode.setdefault(prompt, []).append((b, (b, ctx), t))
    paths = [
        _plot([(f"history {h} tokens", pts) for h, pts in sorted(prefill.items())], fits["prefill"],
              f"T_pre(history, new): {title}", "new tokens", out_dir / "prefill.png"),
        _plot([(f"prompt {p} tokens per sequence", pts) for p, pts in sorted(decode.items())], fits["decode"],
              f"T_dec(batch, context): {title}", "batch size (sequences)", out_dir / "decode.png"),
    ]
    if fits["kv"] is not None:
        kv = [(n, (n, 0), t) for n, _, t in medians([(p.bytes, 0, p.time_s) for p in points.kv])]
        paths.append(_plot([("prefill -> decode engine", kv)], fits["kv"], f"T_kv(bytes): {title}",
                           "KV bytes moved", out_dir / "kv.png"))
    if fits["remote"] is not None:
        paths.append(_plot_remote(points, fits["remote"], title, out_dir / "remote.png"))
    return paths


def _plot_remote(points: Measurements, fits: dict[str, FitResult], title: str, path: Path) -> Path:
    """The remote round's prefill request by tokens read, and its export and join,
    into one PNG (``_plot`` per function would be three)."""
    remote: dict[int, list] = {}
    for h, n, t in medians([(p.read_tokens, p.new_tokens, p.prefill_s) for p in points.remote]):
        remote.setdefault(h, []).append((n, (h, n), t))
    export = [(h, (h, 0), t) for h, _, t in medians([(p.hist_tokens, 0, p.export_s) for p in points.remote
                                                     if p.export_s is not None])]
    join = [(n, (n, 0), t) for n, _, t in medians([(p.new_tokens, 0, p.join_s) for p in points.remote])]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), layout="constrained")
    _draw(axes[0], [(f"history read {h} tokens", pts) for h, pts in sorted(remote.items())], fits["prefill"],
          "prefill engine's request", "new tokens")
    _draw(axes[1], [("export", export)], fits["export"], "history export (decode engine)", "history tokens")
    _draw(axes[2], [("join", join)], fits["join"], "join (decode engine, to its first token)", "new tokens")
    fig.suptitle(f"a remote round's engine requests: {title}", fontsize=11)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="outside right upper", fontsize=8)
    return _save(fig, path)


def _plot(curves: list[Curve], fit: FitResult, title: str, xlabel: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8.5, 4.5), layout="constrained")
    _draw(ax, curves, fit, title, xlabel)
    fig.legend(loc="outside right upper", fontsize=8)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _draw(ax, curves: list[Curve], fit: FitResult, title: str, xlabel: str) -> None:
    """Measured points (hollow: held out) and the fit through the same sizes, on log axes."""
    held = {(a, b) for a, b, _ in fit.held_out}
    for i, (label, pts) in enumerate(curves):
        colour = f"C{i % 10}"
        pts = sorted(pts)
        ax.plot([x for x, _, _ in pts], [1000 * fit.cost(*args) for _, args, _ in pts], "-", color=colour,
                label=label)
        for x, args, t in pts:
            ax.plot(x, 1000 * t, "o", color=colour, markerfacecolor="none" if args in held else colour, markersize=5)
    ax.plot([], [], "-", color="grey", label="fitted")
    ax.plot([], [], "o", color="grey", label="measured (median of repeats)")
    ax.plot([], [], "o", color="grey", markerfacecolor="none", label="held out of the fit")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    # Plain numbers on both axes: sizes as measured, times in ms (not 2^k or 6x10^1).
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_major_formatter(ScalarFormatter())
    low, high = ax.get_ylim()
    # Within one decade a log axis has no major tick: label the minor ones instead.
    ax.yaxis.set_minor_formatter(NullFormatter() if high / low >= 10 else ScalarFormatter())
    ax.set_xlabel(xlabel)
    ax.set_ylabel("time (ms)")
    ax.set_title(f"{title}\nheld-out MAPE {100 * fit.held_out_mape:.1f} %, breakpoints {list(fit.breakpoints)}",
                 fontsize=10)


def plot_sim_vs_real(real_runs: list[list[SessionRecord]], sim: list[SessionRecord], title: str, path: Path) -> Path:
    """Per round, the real TTFT and mean ITL (y) against the simulated (x), one colour
    per real run, with the line y = x; written as PNG to ``path``."""
    simulated = {(r.session_id, r.round_index): r for s in sim for r in s.rounds if r.done_s is not None}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), layout="constrained")
    for ax, name, value in ((axes[0], "TTFT", lambda r: r.ttft_s),
                            (axes[1], "mean ITL", lambda r: r.itls_s.sum_s / len(r.itls_s) if len(r.itls_s) else None)):
        lows, highs = [], []
        for i, run in enumerate(real_runs):
            pairs = [(value(simulated[k]), value(r)) for s in run for r in s.rounds
                     if r.done_s is not None and (k := (r.session_id, r.round_index)) in simulated]
            pairs = [(x, y) for x, y in pairs if x and y]
            ax.plot([1000 * x for x, _ in pairs], [1000 * y for _, y in pairs], "o", color=f"C{i}", alpha=0.6,
                    markersize=4, label=f"real run {i + 1}")
            lows += [min(p) for p in pairs]
            highs += [max(p) for p in pairs]
        if lows:
            span = (1000 * min(lows) / 1.2, 1000 * max(highs) * 1.2)
            ax.plot(span, span, "--", color="grey", label="real = simulated")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(f"simulated {name} (ms)")
        ax.set_ylabel(f"real {name} (ms)")
        ax.set_title(f"per-round {name}", fontsize=10)
    fig.suptitle(f"sim vs real: {title}", fontsize=11)
    axes[1].legend(loc="upper left", fontsize=8)
    return _save(fig, path)
