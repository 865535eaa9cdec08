"""Perf model files that need no catalog (format ``ampd.perf.alphabeta/2``), their measured
fields, the ``/1`` files still read, and ``load_perf_model`` (alpha-beta JSON or profile).
Expected values worked out by hand from tests/hand_perf_file.py."""

import json

import pytest

from ampd.core.deployment import Role, WorkerSpec
from ampd.core.errors import InputError
from ampd.perf import EngineBatching, load_perf_model
from ampd.perf.catalog import ModelSpec
from ampd.perf.model import FORMAT_V1, AlphaBetaPerfModel, build_perf_model
from hand_perf_file import REMOTE_PATH, hand_model, write_hand_model

P0 = WorkerSpec(0, Role.PREFILL, 1, server=0)
D1 = WorkerSpec(1, Role.DECODE, 1, server=0)
D2_OTHER_SERVER = WorkerSpec(2, Role.DECODE, 1, server=1)


def _from(data: dict) -> AlphaBetaPerfModel:
    return AlphaBetaPerfModel.from_json(json.dumps(data))


def test_a_model_outside_the_catalog_times_work_by_its_coefficients_and_measurements():
    m = _from(hand_model())
    assert (m.model.name, m.gpu.name, m.tps) == ("my-8b", "my-gpu", (1,))
    assert m.prefill_s(5000, 1000, 1) == pytest.approx(0.01 + 1000 * 1e-4)  # 0.11 s, history free
    assert m.decode_step_s(32, 64_000, 1) == pytest.approx(0.02)
    assert m.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    # measured link: 1 ms + 1 ns/byte x 1,000 tokens x 131,072 bytes, whatever the servers
    assert m.kv_transfer_s(1000, P0, D1) == pytest.approx(0.001 + 0.131072)
    assert m.kv_transfer_s(1000, P0, D2_OTHER_SERVER) == pytest.approx(0.132072)
    assert m.kv_transfer_s(1000, D1, D1) == 0.0
    assert m.kv_capacity_tokens(1) == 100_000
    assert m.batching == EngineBatching("chunked", 512)
    assert m.request_overhead_s == 0.005


def test_without_measurements_the_figures_come_from_the_specs():
    data = hand_model()
    for key in ("kv_capacity_tokens", "kv_transfer", "batching", "request_overhead_s"):
        del data[key]
    m = _from(data)
    assert m.request_overhead_s == 0.0  # the engines alone, as a catalog build times them
    # (1 x 40e9 x 0.9 - 8,030,261,248 x 2 bytes) // 131,072 = 19,939,477,504 // 131,072
    assert m.kv_capacity_tokens(1) == 152_126
    assert m.batching is None
    # topology left out: the GPU's datasheet NVLink (100 GB/s both ways, 50 one way) on one server
    assert m.kv_transfer_s(1000, P0, D1) == pytest.approx(50e-6 + 131_072_000 / 50e9)
    # a measured KV size replaces the spec's everywhere, capacity included (an FP8 cache, say)
    m = _from({**data, "kv_bytes_per_token": 65_536})
    assert m.kv_bytes_per_token == 65_536 and m.kv_capacity_tokens(1) == 304_252


def test_round_trip_keeps_every_field(tmp_path):
    m = _from(hand_model())
    back = AlphaBetaPerfModel.from_json(m.to_json())
    assert back == m and back.measured == m.measured and back.batching == m.batching
    written = json.loads(m.to_json())
    assert written["format"] == "ampd.perf.alphabeta/2"
    assert written["kv_capacity_tokens"] == {"1": 100_000} and written["kv_transfer"] == hand_model()["kv_transfer"]
    assert written["request_overhead_s"] == 0.005


def test_a_measured_remote_path_replaces_the_papers_read_prefill_and_send():
    paper = _from(hand_model())
    # The paper's stages: KV read of the history, T_pre, KV send of the new tokens.
    assert paper.remote_stages_s(1000, 100, P0, D1) == pytest.approx(
        (0.001 + 0.131072, 0.01 + 0.01, 0.001 + 0.0131072))
    assert paper.remote_export_s(1000, P0, D1) == 0.0  # all of T_pre on the prefill engine
    measured = _from({**hand_model(), "remote_path": REMOTE_PATH})
    # Nothing read ahead; on the prefill worker the export request (5 ms serving path + 20 ms
    # + 1 ms) then the prefill engine's request (30 + 20 + 10 ms, and its 5 ms path); the join
    # (25 + 1 ms, and its 5 ms path). Each path is the plain request's: none was timed. The
    # export leads the compute stage, on the decode engine.
    assert measured.remote_stages_s(1000, 100, P0, D1) == pytest.approx((0.0, 0.026 + 0.065, 0.031))
    assert measured.remote_export_s(1000, P0, D1) == pytest.approx(0.026)
    assert measured.remote_stages_s(0, 100, P0, D1) == pytest.approx((0.0, 0.055, 0.031))  # no history, no export
    assert measured.remote_export_s(0, P0, D1) == 0.0
    # Its stages hold every request's path, so the round adds none; the paper's stages hold
    # none, so its round adds the prefill request's before the queue and the join's after the
    # send; a local round, its one request's.
    assert measured.round_paths_s(1, 1) == (0.0, 0.0)
    assert paper.round_paths_s(1, 1) == (0.005, 0.005)
    assert measured.round_paths_s(None, 1) == paper.round_paths_s(None, 1) == (0.005, 0.0)
    # A decode worker of a TP the profile did not measure: the paper's stages.
    d2 = WorkerSpec(3, Role.DECODE, 2, server=0)
    assert measured.remote_stages_s(1000, 100, P0, d2) == paper.remote_stages_s(1000, 100, P0, d2)
    assert AlphaBetaPerfModel.from_json(measured.to_json()) == measured
    assert json.loads(measured.to_json())["remote_path"] == REMOTE_PATH


def test_a_remote_paths_own_serving_paths_replace_the_plain_requests_in_its_stages():
    # The same remote path, its requests' serving paths timed: export 7 ms, prefill request
    # 12 ms, join 3 ms, where a plain request's is 5 ms.
    timed = {"1": {**REMOTE_PATH["1"], "paths_s": {"export": 0.007, "prefill": 0.012, "join": 0.003}}}
    measured = _from({**hand_model(), "remote_path": timed})
    # compute: export 7 + 20 + 1 ms, prefill request 30 + 20 + 10 ms and its 12 ms; send: the
    # join 25 + 1 ms and its 3 ms.
    assert measured.remote_stages_s(1000, 100, P0, D1) == pytest.approx((0.0, 0.028 + 0.06 + 0.012, 0.026 + 0.003))
    assert measured.remote_export_s(1000, P0, D1) == pytest.approx(0.028)
    assert measured.remote_request_paths_s(1) == (0.007, 0.012, 0.003)
    # Without them (an older profile) each is the plain request's.
    assert _from({**hand_model(), "remote_path": REMOTE_PATH}).remote_request_paths_s(1) == (0.005,) * 3
    assert AlphaBetaPerfModel.from_json(measured.to_json()) == measured
    assert json.loads(measured.to_json())["remote_path"] == timed


def test_a_serving_stack_adds_its_phases_where_a_round_meets_them():
    # The coordinator's route 2 ms and the client's leg 13 ms on every round; a remote round's
    # dispatch 8 ms before the prefill engine and handoff 6 ms before the join.
    stack = {"route_s": 0.002, "dispatch_s": 0.008, "handoff_s": 0.006, "client_s": 0.013}
    measured = _from({**hand_model(), "remote_path": REMOTE_PATH, "serving_stack": stack})
    assert measured.round_paths_s(1, 1) == pytest.approx((0.002 + 0.013 + 0.008, 0.006))
    assert measured.round_paths_s(None, 1) == pytest.approx((0.002 + 0.013 + 0.005, 0.0))  # and one request
    paper = _from({**hand_model(), "serving_stack": stack})  # the paper's stages: two requests besides
    assert paper.round_paths_s(1, 1) == pytest.approx((0.023 + 0.005, 0.006 + 0.005))
    # The stages are the engines' alone: the stack does not touch them.
    assert measured.remote_stages_s(1000, 100, P0, D1) == _from(
        {**hand_model(), "remote_path": REMOTE_PATH}).remote_stages_s(1000, 100, P0, D1)
    assert AlphaBetaPerfModel.from_json(measured.to_json()) == measured
    assert json.loads(measured.to_json())["serving_stack"] == stack
    # A negative zero is a zero: written back without its sign.
    signed = _from({**hand_model(), "serving_stack": {**stack, "handoff_s": -0.0}})
    assert str(json.loads(signed.to_json())["serving_stack"]["handoff_s"]) == "0.0"


def test_a_catalog_build_is_written_in_v2_with_full_specs_and_read_back_identical():
    h20 = build_perf_model("Llama-3.1-8B", "H20", tps=(1, 2))
    data = json.loads(h20.to_json())
    assert set(data["model"]) == set(ModelSpec.__dataclass_fields__) and data["model"]["params"] == 8_030_261_248
    assert "kv_transfer" not in data and "batching" not in data  # nothing measured, nothing written
    back = _from(data)
    assert back == h20 and back.prefill_s(100, 700, 2) == h20.prefill_s(100, 700, 2)


def test_v1_files_are_still_read_with_catalog_names():
    h20 = build_perf_model("Llama-3.1-8B", "H20", tps=(1, 2))
    data = {**json.loads(h20.to_json()), "format": FORMAT_V1, "model": "Llama-3.1-8B", "gpu": "H20"}
    assert _from(data) == h20


def _without(data: dict, section: str, key: str) -> dict:
    data[section] = {k: v for k, v in data[section].items() if k != key}
    return data


@pytest.mark.parametrize("change, message", [
    (lambda d: d["kv_transfer"].update(alpha_s=-0.001), "kv_transfer.alpha_s: expected a finite number >= 0"),
    (lambda d: d["kv_transfer"].update(s_per_byte="1e-9"), "kv_transfer.s_per_byte"),
    (lambda d: _without(d, "kv_transfer", "s_per_byte"), "kv_transfer: missing 's_per_byte'"),
    (lambda d: d.update(kv_transfer=3), "kv_transfer: expected an object"),
    (lambda d: d.update(kv_capacity_tokens={"2": 10}), "kv_capacity_tokens for TP=2, which has no cost function"),
    (lambda d: d.update(kv_capacity_tokens={"tp1": 10}), "kv_capacity_tokens: key 'tp1' is not a TP degree"),
    (lambda d: d.update(kv_capacity_tokens={"1": 0}), "kv_capacity_tokens.1: expected an integer >= 1"),
    (lambda d: d.update(kv_capacity_tokens={"1": 1.5}), "kv_capacity_tokens.1"),
    (lambda d: d.update(kv_bytes_per_token=True), "kv_bytes_per_token: expected an integer >= 1"),
    (lambda d: d["batching"].update(mode="eager"), "batching.mode: 'eager' is not one of"),
    (lambda d: _without(d, "batching", "chunk_tokens"), "batching.chunk_tokens: required"),
    (lambda d: d["batching"].update(budget=1), "batching: unknown field 'budget'"),
    (lambda d: d.update(kv_capacity={"1": 5}), "unknown field 'kv_capacity'"),
    (lambda d: d.update(request_overhead_s=-0.01), "request_overhead_s: expected a finite number >= 0"),
    (lambda d: d.update(request_overhead_s=50), "request_overhead_s: 50 s is more than 10 s"),
    (lambda d: d.update(remote_path={"2": REMOTE_PATH["1"]}), "remote_path for TP=2, which has no cost function"),
    (lambda d: d.update(remote_path={"1": {**REMOTE_PATH["1"], "join": None}}), "remote_path.1.join: expected an "
                                                                                  "object"),
    (lambda d: d.update(remote_path={"1": {k: v for k, v in REMOTE_PATH["1"].items() if k != "export"}}),
     "remote_path.1: missing 'export'"),
    (lambda d: d.update(remote_path={"1": {**REMOTE_PATH["1"], "export": {"fixed_s": -1, "s_per_token": 0}}}),
     "remote_path.1.export.fixed_s: expected a finite number >= 0"),
    (lambda d: d.update(remote_path={"1": {**REMOTE_PATH["1"], "prefill": {"segments": {}}}}),
     "remote_path.1.prefill: missing or malformed field"),
    (lambda d: d.update(remote_path={"1": {**REMOTE_PATH["1"], "join": {"fixed_s": 10**400, "s_per_token": 0}}}),
     "remote_path.1.join.fixed_s: expected a finite number >= 0"),
    (lambda d: d.update(remote_path={"1": {**REMOTE_PATH["1"], "join": {"fixed_s": 32.6, "s_per_token": 0}}}),
     "remote_path.1.join.fixed_s: 32.6 s is more than 10 s"),
    (lambda d: d.update(remote_path={"01": REMOTE_PATH["1"]}), "remote_path: key '01' is not a TP degree"),
    (lambda d: d.update(remote_path={"1": {**REMOTE_PATH["1"], "paths_s": {"export": 0.007, "prefill": 0.012}}}),
     "remote_path.1.paths_s: missing 'join'"),
    (lambda d: d.update(remote_path={"1": {**REMOTE_PATH["1"], "paths_s": {"export": 0.007, "prefill": -0.001,
                                                                            "join": 0.003}}}),
     "remote_path.1.paths_s.prefill: expected a finite number >= 0"),
    (lambda d: d.update(remote_path={"1": {**REMOTE_PATH["1"], "paths_s": {"export": 0.007, "prefill": 0.012, "join": 30}}}),
     "remote_path.1.paths_s.join: 30 s is more than 10 s"),
    (lambda d: d.update(serving_stack={"route_s": 0.002, "dispatch_s": 0.008, "client_s": 0.013}),
     "serving_stack: missing 'handoff_s'"),
    (lambda d: d.update(serving_stack={"route_s": 0.002, "dispatch_s": 0.008, "handoff_s": 0.006, "client_s": 0.013,
                                       "queue_s": 0.001}), "serving_stack: unknown field 'queue_s'"),
    (lambda d: d.update(serving_stack={"route_s": 0.002, "dispatch_s": 8, "handoff_s": -0.006, "client_s": 0.013}),
     "serving_stack.handoff_s: expected a finite number >= 0"),
    (lambda d: d.update(serving_stack={"route_s": 2.0, "dispatch_s": 8.0, "handoff_s": 6.0, "client_s": 13.0}),
     "serving_stack.client_s: 13.0 s is more than 10 s"),
    (lambda d: d.update(serving_stack=[0.002, 0.008, 0.006, 0.013]), "serving_stack: expected an object"),
    (lambda d: d.update(shared_host={}), "shared_host: missing 'decode_step_factor'"),
    (lambda d: d.update(shared_host={"decode_step_factor": 1.5, "prefill_factor": 1}),
     "shared_host: unknown field 'prefill_factor'"),
    (lambda d: d.update(shared_host={"decode_step_factor": 0.8}), "shared_host.decode_step_factor: expected a number "
                                                                   "from 1 to 10"),
    (lambda d: d.update(shared_host={"decode_step_factor": 187}), "shared_host.decode_step_factor: expected a number "
                                                                   "from 1 to 10"),
    (lambda d: d.update(shared_host={"decode_step_factor": "1.87"}), "shared_host.decode_step_factor: expected"),
    (lambda d: d.update(shared_host={"decode_step_factor": True}), "shared_host.decode_step_factor: expected"),
    (lambda d: d.update(shared_host={"decode_step_factor": 10**400}), "shared_host.decode_step_factor: expected"),
    (lambda d: d.update(shared_host=1.87), "shared_host: expected an object"),
    (lambda d: _without(d, "model", "hidden_size"), "model: missing 'hidden_size'"),
    (lambda d: d["model"].update(num_layers="32"), "model.num_layers: expected an integer > 0"),
    (lambda d: d["model"].update(active_params=9_000_000_000), "model.active_params: 9000000000 is more than params"),
    (lambda d: d["gpu"].update(memory_gb=0), "gpu.memory_gb: expected a number > 0"),
    (lambda d: d.update(gpu="my-gpu"), "gpu: expected an object"),
])
def test_bad_values_are_refused_naming_the_field(change, message):
    data = hand_model()
    change(data)
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _from(data)


def test_a_shared_host_factor_is_read_written_and_1_where_not_measured():
    measured = _from({**hand_model(), "shared_host": {"decode_step_factor": 1.87}})
    assert measured.decode_step_factor_beside_prefill == 1.87
    assert json.loads(measured.to_json())["shared_host"] == {"decode_step_factor": 1.87}
    assert _from(json.loads(measured.to_json())) == measured
    assert _from(hand_model()).decode_step_factor_beside_prefill == 1.0
    assert build_perf_model("Llama-3.1-8B", "H100-SXM").decode_step_factor_beside_prefill == 1.0


def test_a_huge_value_is_cut_short_in_the_message():
    stack = {"route_s": 10**400, "dispatch_s": 0, "handoff_s": 0, "client_s": 0}
    with pytest.raises(InputError) as err:
        _from({**hand_model(), "serving_stack": stack})
    assert str(err.value) == ("serving_stack.route_s: expected a finite number >= 0, got "
                              "10000000000000000000...(401 characters)")


def test_load_reads_a_model_or_a_profile_holding_one(tmp_path):
    model_path = write_hand_model(tmp_path / "model.json")
    profile = {"format": "ampd.profile/1", "perf_model": hand_model(), "points": []}
    profile_path = write_hand_model(tmp_path / "profile.json", profile)
    assert load_perf_model(model_path) == load_perf_model(profile_path) == _from(hand_model())
    assert load_perf_model(model_path) is load_perf_model(model_path)  # read once per file version
    write_hand_model(model_path, {**hand_model(), "kv_bytes_per_token": 65_536})
    assert load_perf_model(model_path).kv_bytes_per_token == 65_536


@pytest.mark.parametrize("content, message", [
    ({"format": "ampd.profile/1", "points": []}, "a profile .* without a 'perf_model' object"),
    ({"format": "ampd.profile/1", "perf_model": {**hand_model(), "batching": {"mode": "x"}}}, "batching.mode"),
    ({"format": "something"}, "format 'something'"),
    ([1, 2], "expected a JSON object"),
])
def test_load_errors_name_the_file(tmp_path, content, message):
    path = write_hand_model(tmp_path / "bad.json", content)
    with pytest.raises(InputError, match=f"bad.json: .*{message}"):
        load_perf_model(path)
    (tmp_path / "text.json").write_text("{not json")
    with pytest.raises(InputError, match="text.json: not valid JSON"):
        load_perf_model(tmp_path / "text.json")
    with pytest.raises(InputError, match="missing.json: cannot read"):
        load_perf_model(tmp_path / "missing.json")
