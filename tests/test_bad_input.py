"""Bad input gets a clear error naming the file, line or field, and nothing runs
half-way (cases found by trying to break the command and the loaders)."""

import json

import pytest

from ampd.cli.main import main
from ampd.core import InputError, Round, Session
from ampd.perf import AlphaBetaPerfModel
from ampd.workload import convert_mooncake, convert_trtllm, load_any, load_trace

GOOD = {"session_id": "a", "arrival_s": 0.0, "rounds": [{"input_tokens": 10, "output_tokens": 2}]}


def _jsonl(tmp_path, *lines, name="t.jsonl", prefix=b""):
    path = tmp_path / name
    path.write_bytes(prefix + "\n".join(lines).encode())
    return path


@pytest.mark.parametrize("round_args", [(100, 0), (0, 1), (10**30, 1), (5, 5, float("nan")), (5, 5, 1e308)])
def test_rounds_outside_their_bounds_are_refused(round_args):
    with pytest.raises(InputError, match="round"):
        Round(*round_args)


@pytest.mark.parametrize("args", [("", 0.0), (" ", 0.0), ("a", float("inf")), ("a", -1.0)])
def test_sessions_outside_their_bounds_are_refused(args):
    with pytest.raises(InputError):
        Session(*args, (Round(1, 1),))
    with pytest.raises(InputError, match="rounds"):
        Session("a", 0.0, ())


def test_huge_values_in_a_trace_name_file_line_and_field(tmp_path):
    huge = dict(GOOD, session_id="b", rounds=[{"input_tokens": 10**400, "output_tokens": 1}])
    path = _jsonl(tmp_path, json.dumps(GOOD), json.dumps(huge))
    with pytest.raises(InputError, match=r"t.jsonl:2: rounds\[0\].input_tokens"):
        load_trace(path)
    tool = dict(GOOD, session_id="c", rounds=[{"input_tokens": 1, "output_tokens": 1, "tool_s": 1e308}])
    with pytest.raises(InputError, match=r"t2.jsonl:1: .*tool_s"):
        load_trace(_jsonl(tmp_path, json.dumps(tool), name="t2.jsonl"))


def test_unparseable_numbers_and_nesting_name_the_line(tmp_path):
    digits = '{"session_id": "x", "arrival_s": 0, "rounds": [{"input_tokens": ' + "9" * 5000 + ', "output_tokens": 1}]}'
    with pytest.raises(InputError, match="t.jsonl:2: json"):
        load_trace(_jsonl(tmp_path, json.dumps(GOOD), digits))
    with pytest.raises(InputError, match="d.jsonl:1: json"):
        load_trace(_jsonl(tmp_path, "[" * 100_000 + "]" * 100_000, name="d.jsonl"))


def test_bom_and_line_separator_inside_strings_load(tmp_path):
    odd = dict(GOOD, session_id="a\u2028b")
    path = _jsonl(tmp_path, json.dumps(odd, ensure_ascii=False), json.dumps(GOOD), prefix=b"\xef\xbb\xbf")
    assert [s.session_id for s in load_trace(path)] == ["a\u2028b", "a"]
    assert len(load_any(path)) == 2


def test_guessing_the_format_of_a_broken_first_line_names_it(tmp_path):
    with pytest.raises(InputError, match="t.jsonl:1: json"):
        load_any(_jsonl(tmp_path, "{not json", json.dumps(GOOD)))
    with pytest.raises(InputError, match="e.jsonl: empty"):
        load_any(_jsonl(tmp_path, "", name="e.jsonl"))
    with pytest.raises(InputError, match="not a regular file"):
        load_any("/dev/zero", "ampd")


def test_trtllm_directory_with_two_files_of_one_name_is_refused(tmp_path):
    trace = {"trace_id": "t", "events": [{"event_type": "message", "role": "assistant", "prompt_tokens": 10,
                                          "completion_tokens": 3}]}
    for sub in ("a", "b"):
        (tmp_path / "dup" / sub).mkdir(parents=True)
        (tmp_path / "dup" / sub / "same.trace.json").write_text(json.dumps(trace))
    with pytest.raises(InputError, match="'same'.*also that of"):
        convert_trtllm(tmp_path / "dup")


def test_mooncake_parameters_are_checked(tmp_path):
    with pytest.raises(InputError, match="block_tokens"):
        convert_mooncake(tmp_path / "x.jsonl", block_tokens=0)
    with pytest.raises(InputError, match="shared_fraction"):
        convert_mooncake(tmp_path / "x.jsonl", shared_fraction=float("nan"))


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--seed", "-5"], "seed"),
    (["simulate", "--ttft-slo-s", "inf"], "slo.ttft_s"),
    (["simulate", "--workload", ""], "empty name"),
    (["simulate", "--gpus", "1000000000000"], "cluster.num_gpus"),
    (["simulate", "--workload", "toolbench", "--trace-format", "mooncake"], "trace_format applies"),
])
def test_bad_options_exit_2_with_the_field(argv, message, capsys, tmp_path):
    assert main(argv + ["--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_unwritable_output_fails_before_simulating(tmp_path, capsys):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    assert main(["sweep", "--rates", "0.5", "--num-sessions", "5", "--out", str(blocker), "--quiet"]) == 2
    assert "cannot create the results folder" in capsys.readouterr().err


def test_rate_zero_is_refused_not_ignored(capsys, tmp_path):
    assert main(["simulate", "--rate", "0", "--out", str(tmp_path)]) == 2
    assert "workload.rate_per_s" in capsys.readouterr().err


def test_trace_chosen_in_a_config_file(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[workload]\ntrace = "builtin:trtllm-swebench"\narrivals = "poisson"\nrate_per_s = 0.1\nnum_sessions = 2\n')
    assert main(["simulate", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["num_sessions"] == 2 and summary["workload"] == "builtin:trtllm-swebench"
    assert summary["verdict"] == "transient"


def test_duplicate_session_ids_are_refused_by_the_simulator():
    from ampd.config import RunConfig, override
    from ampd.run.simulate import simulate
    config = override(RunConfig(), slo={"ttft_s": 1.0, "itl_s": 0.1}, cluster={"deployment": "D:<TP=4,DP=1>"})
    with pytest.raises(InputError, match="'a' appears twice"):
        simulate(config, [Session("a", 0.0, (Round(100, 5),)), Session("a", 1.0, (Round(100, 5),))])


@pytest.mark.parametrize("content", [b"", b"\xff\xfe", b"[1, 2]", b"null", b'{"format": "x"}'])
def test_corrupt_perf_model_file_names_the_file(tmp_path, content):
    path = tmp_path / "perf.json"
    path.write_bytes(content)
    with pytest.raises(InputError, match="perf.json"):
        AlphaBetaPerfModel.load(path)
    with pytest.raises(InputError, match="missing.json"):
        AlphaBetaPerfModel.load(tmp_path / "missing.json")
