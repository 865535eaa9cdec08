"""``ampd plan`` end to end on small workloads, and its refusals (called through a
parser built with ``ampd.cli.plan.register``, as ``ampd.cli.main`` does)."""

import argparse
import json

import pytest

from ampd.cli.plan import register
from ampd.core.errors import InputError

SMALL = ["--workload", "toolbench", "--num-sessions", "40", "--rate", "1.0"]


def _run(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="ampd")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", *argv])
    args.func(args)


def _plans(out_dir) -> dict:
    return json.loads((out_dir / "plans.json").read_text())


def test_plan_prints_and_writes_the_top_3_in_the_papers_notation(tmp_path, capsys):
    _run(SMALL + ["--out", str(tmp_path)])
    result = _plans(tmp_path)
    names = [p["deployment"] for p in result["plans"]]
    assert len(names) == 3 == len(set(names)) and all(n.startswith("P:<TP=") and " D:<TP=" in n for n in names)
    assert all(p["status"] == "optimal" for p in result["plans"])
    assert [p["objective"] for p in result["plans"]] == sorted(p["objective"] for p in result["plans"])
    # ampd-slo (the default system) is planned co-designed with its router: no fixed share
    assert result["local_share"] is None and result["config"]["workload"]["rate_per_s"] == 1.0
    assert result["config"]["system"] == "ampd-slo"
    printed = capsys.readouterr().out
    assert all(n in printed for n in names) and "planned for ampd-slo, co-designed" in " ".join(printed.split())
    _run(SMALL + ["--out", str(tmp_path), "--local-share", "0.2"])
    assert _plans(tmp_path)["local_share"] == 0.2


def test_the_system_planned_for_is_the_configurations_else_ampd_slo(tmp_path):
    # a configuration file's system is planned for (before, --system's default replaced it);
    # --system replaces both; plain PD disaggregation gets its fixed share, 0
    config = tmp_path / "pd.toml"
    config.write_text('system = "pd-disagg"\n')
    _run(SMALL + ["--config", str(config), "--out", str(tmp_path / "file")])
    from_file = _plans(tmp_path / "file")
    assert from_file["config"]["system"] == "pd-disagg" and from_file["local_share"] == 0.0
    colocated = tmp_path / "vllm.toml"
    colocated.write_text('system = "vllm"\n')
    with pytest.raises(InputError, match=f"{colocated}: system: system 'vllm' runs colocated replicas"):
        _run(SMALL + ["--config", str(colocated), "--out", str(tmp_path / "vllm")])
    _run(SMALL + ["--config", str(config), "--system", "ampd", "--out", str(tmp_path / "flag")])
    from_flag = _plans(tmp_path / "flag")
    assert from_flag["config"]["system"] == "ampd" and from_flag["local_share"] is None


def test_milp_gives_the_same_plans_as_scip(tmp_path):
    _run(SMALL + ["--out", str(tmp_path / "scip"), "--top-k", "5"])
    _run(SMALL + ["--out", str(tmp_path / "milp"), "--top-k", "5", "--solver", "milp"])
    scip, milp = _plans(tmp_path / "scip")["plans"], _plans(tmp_path / "milp")["plans"]
    assert [p["deployment"] for p in scip] == [p["deployment"] for p in milp]


def test_simulate_ranks_the_top_plans_and_a_sample(tmp_path, capsys):
    # steady-state runs at half the load: the planner's top 3 carry it; stable plans get ranks
    # 1..k, the others (a sample plan may be overloaded) share rank k + 1
    steady = ["--workload", "toolbench", "--rate", "0.5"]
    _run(steady + ["--out", str(tmp_path), "--simulate", "--sample", "2", "--jobs", "1", "--system", "pd-disagg"])
    result = _plans(tmp_path)
    rows = result["simulated"]
    assert len(rows) == 5 and result["local_share"] == 0.0
    assert all(r["verdict"] == "stable" for r in rows[:3])
    stable = sorted(r["simulated_rank"] for r in rows if r["verdict"] == "stable")
    assert stable == list(range(1, len(stable) + 1))
    assert all(r["simulated_rank"] == len(stable) + 1 for r in rows if r["verdict"] != "stable")
    assert sorted(r["planned_rank"] for r in rows) == [1, 2, 3, 4, 5]
    assert [r["deployment"] for r in rows[:3]] == [p["deployment"] for p in result["plans"]]
    assert result["agreement"]["comparable"]
    assert set(result["agreement"]) >= {"same_best", "same_top_set", "spearman", "attainment_regret"}
    assert "planned vs simulated" in capsys.readouterr().out


def test_transient_runs_rank_nothing(tmp_path, capsys):
    _run(SMALL + ["--out", str(tmp_path), "--simulate", "--sample", "1", "--jobs", "1", "--system", "pd-disagg"])
    result = _plans(tmp_path)
    assert {r["simulated_rank"] for r in result["simulated"]} == {1}  # all tied: none is a steady state
    assert not result["agreement"]["comparable"] and result["agreement"]["spearman"] is None
    assert "nothing ranks them" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["--gpu", "Z100"], "unknown GPU 'Z100'"),
    (["--gpus", "3"], "too few GPUs"),
    (["--local-share", "1.5"], "local_share must be in [0, 1)"),
    (["--system", "nope"], "unknown system 'nope'"),
    (["--deployment", "P:<TP=2,DP=2> D:<TP=4,DP=1>"], "ampd plan chooses the deployment"),
    (["--system", "vllm"], "system 'vllm' runs colocated replicas, which ampd plan does not plan"),
    (["--system", ""], "unknown system ''"),
])
def test_infeasible_or_bad_input_is_refused_with_the_reason(argv, message, tmp_path):
    with pytest.raises(InputError) as err:
        _run(SMALL + argv + ["--out", str(tmp_path)])
    assert message in str(err.value)


def test_a_model_that_fits_no_replica_is_refused(tmp_path):
    # servers of 2 L40S hold 2 x 48 GB x 0.9 = 86 GB, less than Llama-3.1-70B's 141 GB
    config = tmp_path / "small_servers.toml"
    config.write_text('[cluster]\nmodel = "Llama-3.1-70B"\ngpu = "L40S"\nnum_gpus = 8\ngpus_per_server = 2\n')
    with pytest.raises(InputError) as err:
        _run(SMALL + ["--config", str(config), "--out", str(tmp_path)])
    assert "does not fit in memory at any degree" in str(err.value)


def test_bad_counts_are_refused_by_the_parser(tmp_path, capsys):
    with pytest.raises(SystemExit):
        _run(SMALL + ["--top-k", "0", "--out", str(tmp_path)])
    assert "expected a positive integer" in capsys.readouterr().err


def test_mixed_degrees_adds_two_degree_sides(tmp_path, capsys):
    # Qwen3-32B on 12 GPUs: with the flag, a TP=4 and a TP=2 decode replica (the 2 GPUs no
    # second TP=4 replica would use) bind Z in the top three; the first puts a TP=4 and a
    # TP=2 prefill replica beside them, the second three TP=2 ones. Without it, no plan mixes.
    argv = ["--model", "Qwen3-32B", "--gpus", "12", "--workload", "hotpotqa", "--num-sessions", "60", "--rate", "2.25",
            "--system", "ampd"]
    _run(argv + ["--out", str(tmp_path / "mixed"), "--mixed-degrees"])
    _run(argv + ["--out", str(tmp_path / "one")])
    mixed, one = (_plans(tmp_path / d) for d in ("mixed", "one"))
    names = [p["deployment"] for p in mixed["plans"]]
    assert names[:2] == ["P:<TP=4,DP=1>+<TP=2,DP=1> D:<TP=4,DP=1>+<TP=2,DP=1>",
                         "P:<TP=2,DP=3> D:<TP=4,DP=1>+<TP=2,DP=1>"]
    best = mixed["plans"][0]
    assert best["num_gpus"] == 12 and best["prefill"]["extra"] == best["decode"]["extra"] == ["<TP=2,DP=1>"]
    assert best["prefill"]["tau"] < mixed["plans"][1]["prefill"]["tau"] and mixed["config"]["planner"]["mixed_degrees"]
    assert not any("+" in p["deployment"] for p in one["plans"])
    assert names[0] in capsys.readouterr().out
    # --no-mixed-degrees turns off what a configuration file turned on
    config = tmp_path / "mixed.toml"
    config.write_text("[planner]\nmixed_degrees = true\n")
    _run(argv + ["--config", str(config), "--out", str(tmp_path / "off"), "--no-mixed-degrees"])
    assert [p["deployment"] for p in _plans(tmp_path / "off")["plans"]] == [p["deployment"] for p in one["plans"]]
