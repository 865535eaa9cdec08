"""Terminal tables of results (rich)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table


def _pct(x) -> str:
    return "-" if x is None or x != x else f"{100 * x:.1f}%"


def _ms(x) -> str:
    return "-" if x is None or x != x else f"{1000 * x:.0f}"


def summary_table(title: str, rows: Sequence[dict]) -> Table:
    """One row per run: attainment, TTFT and ITL percentiles (ms), local share."""
    table = Table(title=title)
    for name in ("workload", "rate/s", "system", "SLO attain.", "TTFT p50", "TTFT p95", "ITL p50", "ITL p95",
                 "local prefill"):
        table.add_column(name, justify="left" if name in ("workload", "system") else "right")
    for r in rows:
        table.add_row(str(r["workload"]), f"{r['rate_per_s']:g}", r["system"], _pct(r["slo_attainment"]),
                      _ms(r["ttft_p50_s"]), _ms(r["ttft_p95_s"]), _ms(r["itl_p50_s"]), _ms(r["itl_p95_s"]),
                      _pct(r["local_prefill_share"]))
    return table


def print_table(table: Table) -> None:
    Console(width=140).print(table)
