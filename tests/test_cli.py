"""The ``ampd`` command end to end on small runs, and its errors."""

import json
from pathlib import Path

import pytest

from ampd.cli.main import main
from ampd.config import load_config


def test_simulate_writes_results_with_config(tmp_path):
    rc = main(["simulate", "--workload", "toolbench", "--num-sessions", "20", "--rate", "0.5", "--out", str(tmp_path)])
    assert rc == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    config = json.loads((tmp_path / "config.json").read_text())
    assert summary["num_sessions"] == 20 and summary["num_complete"] == 20
    assert config["workload"]["rate_per_s"] == 0.5 and config["slo"]["ttft_s"] == summary["ttft_slo_s"]
    decisions = (tmp_path / "decisions.jsonl").read_text().splitlines()
    assert len(decisions) == 20 + summary["num_rounds"]  # one bind per session, one route per round
    assert (tmp_path / "rounds.csv").read_text().count("\n") == summary["num_rounds"] + 1


def test_saved_config_reproduces_the_run(tmp_path):
    main(["simulate", "--workload", "hotpotqa", "--num-sessions", "15", "--rate", "1", "--out", str(tmp_path / "a")])
    main(["simulate", "--config", str(tmp_path / "a" / "config.json"), "--out", str(tmp_path / "b")])
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    b = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert a == b
    assert (tmp_path / "a" / "rounds.csv").read_text() == (tmp_path / "b" / "rounds.csv").read_text()


def test_sweep_from_config_file_writes_table_csv_and_plot(tmp_path, capsys):
    toml = tmp_path / "sweep.toml"
    toml.write_text("""
[sweep]
systems = ["ampd", "pd-disagg"]
[[sweep.workloads]]
workload = "toolbench"
num_sessions = 15
rates_per_s = [0.5, 2.0]
[[sweep.workloads]]
workload = "builtin:trtllm-swebench"
arrivals = "poisson"
rates_per_s = [0.1]
""")
    assert main(["sweep", "--config", str(toml), "--out", str(tmp_path / "o"), "--jobs", "1", "--quiet"]) == 0
    rows = json.loads((tmp_path / "o" / "sweep.json").read_text())["rows"]
    assert [(r["system"], r["workload"], r["rate_per_s"]) for r in rows] == [
        ("ampd", "toolbench", 0.5), ("ampd", "toolbench", 2.0), ("pd-disagg", "toolbench", 0.5),
        ("pd-disagg", "toolbench", 2.0), ("ampd", "builtin:trtllm-swebench", 0.1),
        ("pd-disagg", "builtin:trtllm-swebench", 0.1)]
    assert (tmp_path / "o" / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert "SLO attain." in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--workload", "nosuch"], "nosuch"),
    (["simulate", "--system", "nosuch"], "unknown system 'nosuch'"),
    (["simulate", "--model", "GPT-9"], "GPT-9"),
    (["simulate", "--gpu", "Z100"], "Z100"),
    (["simulate", "--deployment", "P:<TP=8,DP=2> D:<TP=8,DP=1>"], "needs 24 GPUs, the cluster has 8"),
    (["simulate", "--num-sessions", "0"], "workload.num_sessions"),
    (["simulate", "--config", "/nonexistent.toml"], "/nonexistent.toml: no such configuration file"),
    (["sweep"], "give --rates"),
    (["simulate", "--workload", "builtin:trtllm-swebench", "--num-sessions", "3"], "holds 2 sessions"),
    (["simulate", "--drain-s", "1"], "measure.drain_s"),
    (["simulate", "--window-s", "1e12"], "sessions"),
    (["simulate", "--rate", "1e6"], "sessions"),
    (["simulate", "--num-sessions", "20", "--window-s", "300"], "measure.window_s applies to steady-state runs"),
    (["simulate", "--arrivals", "recorded"], "needs a trace"),
    (["sweep", "--rates", "0.5", "--capacity", "--num-sessions", "20"], "capacity needs steady-state runs"),
    (["sweep", "--rates", "0.5", "--capacity", "--window-s", "100"], "transient"),
    (["sweep", "--rates", "0.5", "--ray", "bogus", "--deployment", "P:<TP=2,DP=2> D:<TP=4,DP=1>"], "--ray 'bogus'"),
    (["sweep", "--rates", "0.5", "--systems", "pd-disagg,vllm", "--deployment", "P:<TP=2,DP=2> D:<TP=4,DP=1>"],
     "colocated replicas only"),
    (["reproduce", "--redraw"], "results.json"),
])
def test_bad_input_exits_2_with_a_named_reason(argv, message, capsys, tmp_path):
    assert main(argv + ["--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_a_rate_that_is_not_a_finite_number_is_an_argument_error(capsys):
    with pytest.raises(SystemExit) as err:
        main(["sweep", "--rates", "0.5,nan"])
    assert err.value.code == 2 and "finite positive" in capsys.readouterr().err


def test_a_short_window_is_a_transient_not_a_steady_state(capsys, tmp_path):
    argv = ["simulate", "--window-s", "20", "--deployment", "P:<TP=2,DP=2> D:<TP=4,DP=1>", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "(transient)" in out and "too short for a steady-state verdict" in out
    assert json.loads((tmp_path / "summary.json").read_text())["verdict"] == "transient"


def test_config_values_of_the_wrong_type_are_refused_not_coerced(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[measure]\ndrain_s = true\nwindow_s = '200'\n")
    with pytest.raises(Exception) as err:
        load_config(bad)
    assert "measure.drain_s" in str(err.value) and "measure.window_s" in str(err.value)


def test_config_file_field_errors_name_file_and_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[policy]\nalpha = -1\n[cluster]\nnum_gpus = 'eight'\n")
    with pytest.raises(Exception) as err:
        load_config(bad)
    text = str(err.value)
    assert str(bad) in text and "policy.alpha" in text and "cluster.num_gpus" in text
    bad.write_text("[cluster\n")
    with pytest.raises(Exception, match="not valid TOML"):
        load_config(bad)
    bad.write_text("[sweep]\nsystems = ['ampd']\n[[sweep.workloads]]\nworkload = 'toolbench'\nrates_per_s = [-1]\n")
    with pytest.raises(Exception, match="sweep.workloads.0"):
        load_config(bad)


def test_demo_config_is_valid():
    config, sweep = load_config(Path(__file__).resolve().parent.parent / "configs" / "demo.toml")
    assert config.cluster.num_gpus == 8 and config.cluster.gpu == "H20" and config.cluster.model == "Llama-3.1-70B"
    assert {"ampd", "pd-disagg"} <= set(sweep.systems)
    assert [w.workload for w in sweep.workloads] == ["builtin:mooncake-conversation", "toolbench"]


def test_documented_example_config_is_valid(tmp_path):
    doc = (Path(__file__).resolve().parent.parent / "docs" / "CONFIG.md").read_text()
    example = doc.split("```toml\n", 1)[1].split("```", 1)[0]
    (tmp_path / "example.toml").write_text(example)
    config, sweep = load_config(tmp_path / "example.toml")
    assert config.slo.ttft_s == 1.0 and sweep.workloads[0].rates_per_s == [0.5, 1.0, 2.0]
