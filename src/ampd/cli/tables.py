"""Terminal tables of results (rich)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from ampd.measure import STABLE, TRANSIENT


def _pct(x) -> str:
    return "-" if x is None or x != x else f"{100 * x:.1f}%"


def _ms(x) -> str:
    return "-" if x is None or x != x else f"{1000 * x:.0f}"


def attainment_text(row: dict) -> str:
    """A row's SLO attainment as a table shows it: a number only for a steady
    state; ``unstable`` for an overloaded point (its number measures the run's
    length, not the rate); a transient's number marked as such."""
    verdict = row.get("verdict", STABLE)
    if verdict == STABLE:
        return _pct(row["slo_attainment"])
    if verdict == TRANSIENT:
        return f"{_pct(row['slo_attainment'])} (transient)"
    return "unstable"


def arrivals_text(row: dict) -> str:
    """Which arrivals a run (a row of ``RunOutput.row``) used, as its table's title
    says it: Poisson, or a trace's recorded times as recorded or rescaled (by how
    much, and from which rate of its own, ``ampd.workload.arrival_rate_per_s``)."""
    if row["arrivals"] == "poisson":
        return "Poisson arrivals"
    if row["arrivals_scale"] == 1.0:
        return "recorded arrivals, at the trace's own times"
    own_per_s = row["rate_per_s"] / row["arrivals_scale"]
    return f"recorded arrivals, rescaled from the trace's own {own_per_s:.4g} sessions/s"


def summary_table(title: str, rows: Sequence[dict]) -> Table:
    """One row per run: attainment, TTFT and ITL percentiles, local share; the
    latencies of an unstable point are left out with its attainment."""
    table = Table(title=title)
    for name in ("workload", "rate (sessions/s)", "system", "SLO attain.", "TTFT p50 (ms)", "TTFT p95 (ms)",
                 "ITL p50 (ms)", "ITL p95 (ms)", "local prefill"):
        table.add_column(name, justify="left" if name in ("workload", "system") else "right")
    for r in rows:
        shown = r.get("verdict", STABLE) != "unstable"
        latencies = [_ms(r[k]) if shown else "-" for k in ("ttft_p50_s", "ttft_p95_s", "itl_p50_s", "itl_p95_s")]
        table.add_row(str(r["workload"]), f"{r['rate_per_s']:.4g}", r["system"], attainment_text(r), *latencies,
                      _pct(r["local_prefill_share"]) if shown else "-")
    return table


def capacity_table(title: str, rows: Sequence[dict]) -> Table:
    """One row per (workload, system): its capacity (sessions/s and per GPU) and
    the lowest rate measured not to meet the SLO."""
    table = Table(title=title)
    for name in ("workload", "system", "deployment", "target", "capacity (sessions/s)", "per GPU", "misses SLO at"):
        table.add_column(name, justify="left" if name in ("workload", "system", "deployment") else "right")
    for r in rows:
        above = "-" if r["above_per_s"] is None else f"{r['above_per_s']:.4g}"
        capacity = f"{r['capacity_per_s']:.4g}" if r["capacity_per_s"] else "none found"
        table.add_row(str(r["workload"]), r["system"], r["deployment"], f"{100 * r['target_attainment']:g} %", capacity,
                      f"{r['capacity_per_gpu']:.3g}", above)
    return table


def fit_table(title: str, fits: Sequence[tuple[str, object]]) -> Table:
    """One row per fitted cost function (``ampd.profile.fit.FitResult``): points,
    breakpoints, MAPE on the points fitted and on those held out, and how far two halves
    of the repeats put a point (the machine's scatter; "-" with one repeat)."""
    table = Table(title=title)
    for name in ("function", "grid points", "breakpoints", "train MAPE", "held-out MAPE", "repeats apart"):
        table.add_column(name, justify="left" if name in ("function", "breakpoints") else "right")
    for name, fit in fits:
        table.add_row(name, str(fit.num_train + fit.num_held_out), str(list(fit.breakpoints)),
                      _pct(fit.train_mape), _pct(fit.held_out_mape),
                      _pct(fit.repeat_spread))
    return table


def print_table(table: Table) -> None:
    Console(width=160).print(table)
