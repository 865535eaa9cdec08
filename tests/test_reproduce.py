"""``ampd reproduce``: its pieces on cases worked out by hand, and a tiny grid end to end."""

import json
import pytest

from ampd.cli.main import main
from ampd.config import override
from ampd.perf import build_perf_model
from ampd.run.plan_refine import simulate_capacities
from ampd.run.planning import knee_rate_per_s, plan_for
from ampd.reproduce import analysis, grid
from ampd.reproduce.deployments import colocated_candidates, disaggregated_candidates
from ampd.reproduce.run import prepare
from ampd.reproduce.search import coarse, same_pair
from ampd.run.runner import PointRunner


def test_disaggregated_candidates_of_a_70b_model_on_8_h20():
    # Usable TP: 2, 4, 8 (the 141 GB of weights need 2 x 96 GB). Prefill shares of 8 GPUs give 2..6
    # prefill GPUs: (2,2) -> P2x1 D2x3, P2x2 D2x2, P2x3 D2x1; (2,4) -> P2x2 D4x1; (4,2) -> P4x1 D2x2;
    # (4,4) -> P4x1 D4x1; nothing with TP 8 leaves room for the other role.
    perf = build_perf_model("Llama-3.1-70B", "H20")
    found = {str(d) for d in disaggregated_candidates(perf, 8)}
    assert found == {"P:<TP=2,DP=1> D:<TP=2,DP=3>", "P:<TP=2,DP=2> D:<TP=2,DP=2>", "P:<TP=2,DP=3> D:<TP=2,DP=1>",
                     "P:<TP=2,DP=2> D:<TP=4,DP=1>", "P:<TP=4,DP=1> D:<TP=2,DP=2>", "P:<TP=4,DP=1> D:<TP=4,DP=1>"}
    assert [str(d) for d in colocated_candidates(perf, 8)] == ["D:<TP=2,DP=4>", "D:<TP=4,DP=2>", "D:<TP=8,DP=1>"]
    halves = {str(d) for d in coarse(disaggregated_candidates(perf, 8), 8)}
    assert halves == {"P:<TP=2,DP=2> D:<TP=2,DP=2>", "P:<TP=2,DP=2> D:<TP=4,DP=1>", "P:<TP=4,DP=1> D:<TP=2,DP=2>",
                      "P:<TP=4,DP=1> D:<TP=4,DP=1>"}
    chosen = next(d for d in disaggregated_candidates(perf, 8) if str(d) == "P:<TP=2,DP=2> D:<TP=2,DP=2>")
    assert len(same_pair(disaggregated_candidates(perf, 8), chosen)) == 3


def _row(cell, fraction, system, attainment, local=0.0, verdict="stable"):
    return {"cell": cell, "rate_fraction": fraction, "system": system, "slo_attainment": attainment,
            "workload": cell.split(" / ")[1], "local_prefill_share": local, "verdict": verdict}


def test_gains_by_hand_over_stable_points_only():
    rows = [_row("m / w / 8", 1.0, "ampd", 0.6), _row("m / w / 8", 1.0, "base", 0.3),
            _row("m / w / 8", 2.0, "ampd", 0.2), _row("m / w / 8", 2.0, "base", 0.1),
            _row("m / w / 8", 3.0, "ampd", 0.1), _row("m / w / 8", 3.0, "base", 0.0),
            _row("m / w / 8", 4.0, "ampd", 0.9), _row("m / w / 8", 4.0, "base", 0.1, verdict="unstable")]
    g = analysis.gains(rows, "ampd", "base")
    # relative: +100 % and +100 % (the zero baseline point is left out, the unstable one too);
    # points: +30, +10, +10
    assert g["mean_gain_pct"] == pytest.approx(100.0) and g["max_gain_pct"] == pytest.approx(100.0)
    assert g["mean_gain_points"] == pytest.approx(50 / 3) and g["baseline_zero_points"] == 1
    assert g["unstable_points"] == 1


def test_capacity_gains_by_hand():
    caps = [{"cell": "a", "system": "ampd", "capacity_per_s": 1.5}, {"cell": "a", "system": "base", "capacity_per_s": 1.0},
            {"cell": "b", "system": "ampd", "capacity_per_s": 0.9}, {"cell": "b", "system": "base", "capacity_per_s": 1.0},
            {"cell": "c", "system": "ampd", "capacity_per_s": 0.5}, {"cell": "c", "system": "base", "capacity_per_s": 0.0}]
    g = analysis.capacity_gains(caps, "ampd", "base")
    # ratios 1.5 and 0.9: +50 % and -10 %, mean +20 %; cell c's baseline never met the SLO
    assert g["mean_capacity_gain_pct"] == pytest.approx(20.0)
    assert (g["min_capacity_gain_pct"], g["max_capacity_gain_pct"]) == pytest.approx((-10.0, 50.0))
    assert g["num_cells"] == 2 and g["baseline_zero_cells"] == 1


def test_local_share_by_workload():
    rows = [_row("m / toolbench / 8", 1.0, "ampd", 1, 0.1), _row("m / toolbench / 8", 2.0, "ampd", 1, 0.3)]
    (share,) = analysis.local_share(rows)
    assert share == {"workload": "toolbench", "local_pct": pytest.approx(20.0), "local_pct_max": pytest.approx(30.0),
                     "paper_pct": 13.9}


def test_tiny_reproduce_end_to_end_and_resume(tmp_path, monkeypatch):
    monkeypatch.setattr(grid, "MODELS", ("Llama-3.1-70B",))
    monkeypatch.setattr(grid, "WORKLOADS", {"toolbench": 8})
    monkeypatch.setattr(grid, "QUICK_DISAGGREGATED", ("ampd", "pd-disagg"))
    monkeypatch.setattr(grid, "QUICK_COLOCATED", ("vllm",))
    monkeypatch.setattr("ampd.measure.plan.MIN_WINDOW_SESSIONS", 300)  # in-process (--jobs 1): shorter runs,
    monkeypatch.setattr("ampd.measure.window.MIN_VERDICT_SESSIONS", 150)  # still judged
    monkeypatch.setattr(grid, "QUICK_KNOBS", {"reorder_window": (2, 3), "alpha": (0.9,), "beta": (0.85,)})
    monkeypatch.setattr(grid, "PLANNER_OPTIONS", {"ampd": {"refine_top_k": 2, "refine_by": "capacity"}})
    argv = ["reproduce", "--quick", "--jobs", "1", "--quiet", "--out", str(tmp_path)]
    assert main(argv) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    chosen = {b["system"]: b["chosen_by"] for b in results["tables"]["best_deployments"]}
    assert chosen == {"ampd": "search", "pd-disagg": "search", "vllm": "search",
                      "ampd [planner]": "planner, top 2 by capacity"}
    # The [planner] row runs the ILP's plan, of its two best at the planner's knee, that carries the
    # most, as simulating both here (every run read back from the grid's cache) finds.
    runner = PointRunner(1, False, tmp_path / "points")
    (cell,) = prepare(grid.cells(quick=True), runner)
    config = override(cell.config, system="ampd", cluster={"deployment": "auto"})
    drawn = [p.deployment for p in plan_for(override(config, workload={"rate_per_s": knee_rate_per_s(config)}), 2)]
    capacities = simulate_capacities(config, drawn, runner)
    planned = {b["system"]: b["deployment"] for b in results["tables"]["best_deployments"]}["ampd [planner]"]
    assert planned == str(drawn[capacities.index(max(capacities))])
    # ... and the check can tell: the two carry different loads, and the ILP's first plan at the
    # reference rate (what the row would run were the options ignored) is another deployment.
    assert capacities[0] != capacities[1] and planned != str(plan_for(config, 1)[0].deployment)
    systems = {r["system"] for r in results["grid"]}
    assert systems == set(chosen)
    assert len(results["grid"]) == len(chosen) * len(grid.QUICK_RATE_FRACTIONS)
    assert {g["baseline"] for g in results["tables"]["gains"]} == {"pd-disagg", "vllm"}
    assert {c["system"] for c in results["capacities"]} == set(chosen)
    assert all(r["verdict"] in ("stable", "unstable") for r in results["grid"])
    for name in ("attainment_grid.png", "capacity.png", "latency_breakdown.png", "ablation.png", "sensitivity.png",
                 "tables.md"):
        assert (tmp_path / name).stat().st_size > 0
    cached = sorted(p.name for p in (tmp_path / "points").iterdir())
    assert main(argv) == 0  # a second run reads every point back
    assert sorted(p.name for p in (tmp_path / "points").iterdir()) == cached


def test_the_cell_summary_reads_capacities_and_counts_an_unstable_rate_as_nothing_attained():
    def row(cell, system, attainment, verdict="stable"):
        return {"cell": cell, "system": system, "slo_attainment": attainment, "verdict": verdict}

    def capacity(cell, system, per_s, reference_per_s):
        return {"cell": cell, "system": system, "capacity_per_s": per_s, "reference_per_s": reference_per_s}

    grid_rows = [row("A", "x", 1.0), row("A", "x", 0.8), row("A", "y", 0.9), row("A", "y", 0.5, "unstable"),
                 row("B", "x", 0.6), row("B", "y", 0.7)]
    capacities = [capacity("A", "x", 2.0, 1.0), capacity("A", "y", 2.0, 1.0), capacity("B", "x", 1.0, 2.0),
                  capacity("B", "y", 3.0, 2.0)]
    summary = analysis.cell_summary(grid_rows, capacities)
    a, b = summary["cells"]
    assert a["best"] == ["x", "y"] and b["best"] == ["y"]  # a tie counts for each
    # y in A: (0.9 + 0 for the unstable rate) / 2 = 45 %.
    assert a["systems"]["y"] == {"capacity_per_s": 2.0, "mean_attainment_pct": pytest.approx(45.0),
                                 "unstable_rates": 1, "num_rates": 2}
    by_system = {r["system"]: r for r in summary["systems"]}
    # x: capacity over reference (2 / 1 + 1 / 2) / 2 = 1.25; attainment (90 + 60) / 2 = 75 %.
    assert by_system["x"]["capacity_over_reference"] == pytest.approx(1.25)
    assert by_system["x"]["mean_attainment_pct"] == pytest.approx(75.0)
    # y: (2 / 1 + 3 / 2) / 2 = 1.75, best in both cells, listed first.
    assert summary["systems"][0]["system"] == "y" and by_system["y"]["best_cells"] == 2
    assert by_system["y"]["capacity_over_reference"] == pytest.approx(1.75)
