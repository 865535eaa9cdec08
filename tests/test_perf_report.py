"""Error of the performance model against the measured Splitwise points (target <= 10% MAPE)."""

import pytest

from ampd.perf.report import format_table, mape_table


@pytest.fixture(scope="module")
def rows():
    return mape_table()


@pytest.mark.parametrize("function", ["prefill", "decode"])
def test_mape_within_ten_percent_per_gpu_and_tp(rows, function):
    cells = [r for r in rows if r.function == function]
    assert {(r.gpu, r.tp) for r in cells} == {(g, tp) for g in ("A100-80GB", "H100-SXM") for tp in (0, 2, 4, 8)}
    for r in cells:
        assert r.roofline_mape <= 0.10, r
        assert r.alphabeta_mape <= 0.10, r


def test_batched_prefill_has_no_alpha_beta_column(rows):
    batched = [r for r in rows if r.function == "prefill_batched"]
    assert batched and all(r.alphabeta_mape is None for r in batched)
    assert "n/a" in format_table(batched)
