"""``[cluster] perf_model`` and ``--perf-model``: the file names the model and GPU, times
every runtime (simulator, planner, SLO rule, mock engines), and only its TPs are used.
Expected values worked out by hand from tests/hand_perf_file.py."""

import json

import pytest

from ampd.cli.main import build_parser, main
from ampd.cli.options import config_from_args
from ampd.config import RunConfig, load_config, override, with_perf_model
from ampd.core.deployment import Deployment, Role
from ampd.core.errors import InputError
from ampd.run.resolve import check_runnable, perf_model_for
from ampd.planner import usable_degrees
from ampd.run.planning import resolve_deployment
from ampd.reproduce import grid
from ampd.reproduce.deployments import disaggregated_candidates
from ampd.engines.mock.engine import EngineOptions, MockEngine
from ampd.engines.mock.server import _parser
from ampd.cluster.up import LocalCluster
from ampd.run.slo_rule import reference_tp
from hand_perf_file import REMOTE_PATH, hand_model, write_hand_model

# Two sessions, three rounds of 1,000, 500 and 2,000 new tokens. On the hand model
# (10 ms + 0.1 ms per new token; a 20 ms decode step, TP 1 only) the SLO rule gives
# TTFT = 5 x mean(0.11, 0.06, 0.21) s = 5 x 0.38 / 3 = 0.6333 s and ITL = 1.5 x 20 ms = 30 ms.
TRACE = [
    {"session_id": "s1", "arrival_s": 0.0, "rounds": [{"input_tokens": 1000, "output_tokens": 10, "tool_s": 1.0},
                                                      {"input_tokens": 500, "output_tokens": 10}]},
    {"session_id": "s2", "arrival_s": 1.0, "rounds": [{"input_tokens": 2000, "output_tokens": 10}]},
]
TTFT_SLO_S = 5 * (0.11 + 0.06 + 0.21) / 3 + 2 * 0.005  # plus a remote round's two requests
ITL_SLO_S = 1.5 * 0.02


@pytest.fixture
def perf_file(tmp_path):
    return str(write_hand_model(tmp_path / "perf.json"))


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in TRACE))
    return str(path)


def _toml(tmp_path, text: str) -> str:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return str(path)


def test_model_and_gpu_left_out_take_the_files_names(tmp_path, perf_file):
    config, _ = load_config(_toml(tmp_path, f'[cluster]\nperf_model = "{perf_file}"\n'))
    assert (config.cluster.model, config.cluster.gpu) == ("my-8b", "my-gpu")
    # the names travel with every later change, and a saved configuration reads back
    moved = override(config, cluster={"deployment": "D:<TP=1,DP=8>"})
    assert (moved.cluster.model, moved.cluster.perf_model) == ("my-8b", perf_file)
    (tmp_path / "saved.json").write_text(json.dumps(moved.model_dump(mode="json")))
    assert load_config(tmp_path / "saved.json")[0] == moved
    assert override(RunConfig(), cluster={"perf_model": perf_file}).cluster.gpu == "my-gpu"


def test_a_model_or_gpu_other_than_the_files_is_refused_naming_both(tmp_path, perf_file):
    toml = _toml(tmp_path, f'[cluster]\nperf_model = "{perf_file}"\nmodel = "Llama-3.1-70B"\n')
    with pytest.raises(InputError, match="model is 'Llama-3.1-70B' but perf_model .*perf.json is of model 'my-8b'"):
        load_config(toml)
    toml = _toml(tmp_path, f'[cluster]\nperf_model = "{perf_file}"\nmodel = "MY-8B"\ngpu = "H20"\n')
    with pytest.raises(InputError, match="gpu is 'H20' but .* of gpu 'my-gpu'"):
        load_config(toml)
    with pytest.raises(InputError, match="cluster: perf_model: .*missing.json: cannot read"):
        load_config(_toml(tmp_path, f'[cluster]\nperf_model = "{tmp_path}/missing.json"\n'))


def test_the_command_line_file_replaces_the_configurations_model(tmp_path, perf_file):
    toml = _toml(tmp_path, '[cluster]\nmodel = "Qwen3-32B"\n')
    config, _ = config_from_args(build_parser().parse_args(["simulate", "--config", toml, "--perf-model", perf_file]))
    assert (config.cluster.model, config.cluster.perf_model) == ("my-8b", perf_file)
    # a second file over a configuration's first: the first's names go with it
    other = write_hand_model(tmp_path / "other.json", {**json.loads(open(perf_file).read()),
                                                       "model": {**json.loads(open(perf_file).read())["model"],
                                                                 "name": "other-8b"}})
    assert with_perf_model(config, str(other)).cluster.model == "other-8b"
    args = build_parser().parse_args(["simulate", "--perf-model", perf_file, "--model", "Qwen3-32B"])
    with pytest.raises(InputError, match="'Qwen3-32B' but perf_model"):
        config_from_args(args)


def test_only_the_files_tps_are_used(perf_file, trace_file):
    config = override(RunConfig(), cluster={"perf_model": perf_file, "num_gpus": 4},
                      workload={"name": None, "trace": trace_file, "num_sessions": 2})
    perf = perf_model_for(config)
    assert perf.prefill_s(0, 1000, 1) == pytest.approx(0.11) and perf.kv_capacity_tokens(1) == 100_000
    assert reference_tp(perf) == 1  # twice the smallest fitting TP would be 2: not profiled
    assert usable_degrees(perf, 4, 8) == (1,)
    assert {g.tp for d in disaggregated_candidates(perf, 4) for g in d.groups} == {1}
    planned = Deployment.parse(resolve_deployment(config).cluster.deployment)
    assert {g.tp for g in planned.groups} == {1}
    with pytest.raises(InputError, match=r"TP=2 has no cost functions in the performance model; it has TP=1"):
        check_runnable(override(config, cluster={"deployment": "P:<TP=2,DP=1> D:<TP=1,DP=2>"}))


def test_simulate_with_a_perf_model_file_derives_thresholds_from_it(tmp_path, perf_file, trace_file):
    out = tmp_path / "out"
    assert main(["simulate", "--perf-model", perf_file, "--workload", trace_file, "--num-sessions", "2",
                 "--gpus", "2", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "my-8b" and summary["deployment"] == "P:<TP=1,DP=1> D:<TP=1,DP=1>"
    assert summary["ttft_slo_s"] == pytest.approx(TTFT_SLO_S) and summary["itl_slo_s"] == pytest.approx(ITL_SLO_S)
    assert summary["num_complete"] == 2
    assert json.loads((out / "config.json").read_text())["cluster"]["perf_model"] == perf_file


def test_a_measured_remote_path_adds_the_remote_rounds_floor_to_the_ttft_threshold(tmp_path, trace_file):
    # tests/hand_perf_file.py's REMOTE_PATH: a remote round's requests take, beyond
    # T_pre (10 ms + 0.1 ms per new token):
    # s1 round 0 (no history): prefill 30 + 200 ms, join 25 + 10 ms: 0.265 - 0.11 = 0.155 s;
    # s1 round 1 (1,010 history tokens, 500 new): export 5 + 20 + 1.01 ms, prefill
    #   30 + 100 + 10.1 ms, join 25 + 5 ms: 0.19611 - 0.06 = 0.13611 s;
    # s2 round 0 (2,000 new): prefill 30 + 400 ms, join 25 + 20 ms: 0.475 - 0.21 = 0.265 s.
    data = {**hand_model(), "remote_path": REMOTE_PATH}
    perf_file = str(write_hand_model(tmp_path / "perf.json", data))
    out = tmp_path / "out"
    assert main(["simulate", "--perf-model", perf_file, "--workload", trace_file, "--num-sessions", "2",
                 "--gpus", "2", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    floor_s = (0.155 + 0.13611 + 0.265) / 3
    assert summary["ttft_slo_s"] == pytest.approx(TTFT_SLO_S + floor_s)
    assert summary["itl_slo_s"] == pytest.approx(ITL_SLO_S)


def test_up_starts_mock_engines_timed_by_the_file(tmp_path, perf_file, monkeypatch):
    config = override(RunConfig(), cluster={"perf_model": perf_file, "num_gpus": 2,
                                            "deployment": "P:<TP=1,DP=1> D:<TP=1,DP=1>"})
    cluster = LocalCluster(config, tmp_path / "logs")
    monkeypatch.setattr(LocalCluster, "_spawn", lambda self, name, argv, url=None, env=None: argv)
    decode = next(s for s in cluster.specs() if s.role is Role.DECODE)
    cluster._start_engine(decode)
    argv = cluster.engines[decode.worker_id]
    args = _parser().parse_args(argv[argv.index("ampd.engines.mock.server") + 1:])
    fields = {k: v for k, v in vars(args).items() if k not in ("role", "port", "host", "log_level")}
    engine = MockEngine(EngineOptions(role=Role.DECODE, **fields))
    assert (args.perf_model, args.model, args.gpu) == (perf_file, "my-8b", "my-gpu")
    assert engine.capacity_tokens == 100_000 and engine.perf.prefill_s(0, 1000, 1) == pytest.approx(0.11)
    with pytest.raises(InputError, match="TP=2"):
        MockEngine(EngineOptions(role=Role.DECODE, **{**fields, "tp": 2}))
    with pytest.raises(InputError, match="TP=2 has no cost functions"):
        LocalCluster(override(config, cluster={"deployment": "D:<TP=2,DP=1>"}), tmp_path / "logs")


def test_reproduce_runs_the_grid_on_the_files_model(perf_file):
    cells = grid.cells(False, (perf_file, "my-8b"))
    assert [(c.model, c.perf_model) for c in cells] == [("my-8b", perf_file)] * len(grid.WORKLOADS)
    config = override(RunConfig(), cluster={"model": "my-8b", "num_gpus": 8, "perf_model": perf_file})
    assert perf_model_for(config).tps == (1,)


@pytest.mark.parametrize("engine, measured", [("vllm-nixl", True), ("mock", True), ("vllm", False)])
def test_a_measured_remote_path_is_dropped_for_engines_that_do_not_read_history(tmp_path, engine, measured):
    # vLLM with a one-way connector recomputes the history: none of the measured requests happen.
    path = str(write_hand_model(tmp_path / "perf.json", {**hand_model(), "remote_path": REMOTE_PATH}))
    perf = perf_model_for(RunConfig(cluster={"perf_model": path}, serve={"engine": engine}))
    assert perf.measured_remote_path(1) is measured
