"""The catalog-built alpha-beta model: names, capacity, transfers, JSON, shape of the costs."""

import json
from pathlib import Path

import numpy as np
import pytest

from ampd.core.deployment import Role, WorkerSpec
from ampd.core.errors import InputError
from ampd.perf.alphabeta import ImpossibleFitError
from ampd.perf import load_perf_model
from ampd.perf.interface import PerfModel
from ampd.perf.model import AlphaBetaPerfModel, build_perf_model
from stub_perf import StubPerf

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def h20():
    return build_perf_model("Llama-3.1-70B", "H20")


def test_implements_the_protocol(h20):
    for name in [n for n in dir(PerfModel) if not n.startswith("_")]:
        assert hasattr(h20, name)
    assert h20.kv_bytes_per_token == 327_680


def test_names_are_case_insensitive_and_builds_are_cached(h20):
    assert build_perf_model("llama-3.1-70b", "h20") is h20


@pytest.mark.parametrize("model_name, gpu_name, unknown", [("Llama-9", "H20", "Llama-9"), ("Qwen3-32B", "TPUv5", "TPUv5")])
def test_unknown_names_raise(model_name, gpu_name, unknown):
    with pytest.raises(InputError, match=unknown):
        build_perf_model(model_name, gpu_name)


def test_kv_capacity_by_hand(h20):
    # TP4: 4 x 96e9 x 0.9 = 345.6e9 B usable; weights 2 x 70,553,706,496 = 141,107,412,992 B;
    # (345.6e9 - 141,107,412,992) / 327,680 = 624,061.6 -> 624,061 tokens.
    assert h20.kv_capacity_tokens(4) == 624_061
    # TP1: 86.4e9 B cannot hold 141.1e9 B of weights.
    assert h20.kv_capacity_tokens(1) == 0


def test_kv_transfer_by_hand(h20):
    src, dst = WorkerSpec(0, Role.PREFILL, 2, 0), WorkerSpec(1, Role.DECODE, 4, 1)
    # 1000 tokens x 327,680 B over 200 GB/s, plus 50 us.
    assert h20.kv_transfer_s(1000, src, dst) == pytest.approx(50e-6 + 327_680_000 / 200e9, rel=1e-12)
    assert h20.kv_transfer_s(1000, dst, dst) == 0.0


def test_unfitted_tp_is_an_input_error(h20):
    with pytest.raises(InputError, match="TP=3"):
        h20.prefill_s(0, 100, 3)
    with pytest.raises(InputError, match="TP=16"):
        h20.decode_step_s(1, 100, 16)


def test_costs_grow_with_size_and_shrink_with_tp(h20):
    for tp in h20.tps:
        for hist in (0, 4000, 30000):
            pre = [h20.prefill_s(hist, new, tp) for new in range(1, 20000, 37)]
            assert all(b >= a for a, b in zip(pre, pre[1:]))
        assert h20.prefill_s(5000, 500, tp) > h20.prefill_s(0, 500, tp)
        dec = [h20.decode_step_s(b, b * 1000, tp) for b in range(1, 300)]
        assert all(b >= a for a, b in zip(dec, dec[1:]))
    assert h20.prefill_s(0, 4000, 8) < h20.prefill_s(0, 4000, 4) < h20.prefill_s(0, 4000, 2)


def test_close_to_the_roofline_it_was_fitted_to(h20):
    for tp, errors in h20.fit_report["error_vs_roofline_samples"].items():
        assert errors["prefill"]["mape"] < 0.02 and errors["decode"]["mape"] < 0.02, tp


def test_weights_that_do_not_fit_give_zero_capacity_but_costs():
    a100 = build_perf_model("Llama-2-70B", "A100-80GB")
    assert a100.kv_capacity_tokens(1) == 0 and a100.kv_capacity_tokens(2) > 0
    assert a100.prefill_s(0, 512, 1) > 0


def test_json_round_trip_is_identical(h20, tmp_path):
    path = tmp_path / "perf.json"
    h20.save(path)
    back = AlphaBetaPerfModel.load(path)
    assert back == h20 and back.fit_report == h20.fit_report
    for tp in h20.tps:
        assert back.prefill_s(1234, 567, tp) == h20.prefill_s(1234, 567, tp)
        assert back.decode_step_s(17, 17 * 999, tp) == h20.decode_step_s(17, 17 * 999, tp)


def test_json_with_impossible_coefficients_is_refused(h20):
    data = json.loads(h20.to_json())
    data["tps"]["4"]["decode"]["gamma_s_per_context_token"] = -1e-9
    with pytest.raises(ImpossibleFitError):
        AlphaBetaPerfModel.from_json(json.dumps(data))
    data["format"] = "something else"
    with pytest.raises(InputError, match="format"):
        AlphaBetaPerfModel.from_json(json.dumps(data))


def test_moe_and_other_gpus_build():
    for model_name, gpu_name in [("Mixtral-8x7B", "H200"), ("Qwen3-32B", "L40S"), ("Llama-3.1-8B", "H100-SXM")]:
        m = build_perf_model(model_name, gpu_name, tps=(1, 2))
        assert m.tps == (1, 2) and m.prefill_s(0, 1000, 2) < m.prefill_s(0, 1000, 1)


@pytest.mark.parametrize("source", ["catalog", "profile"])
def test_array_forms_equal_the_scalar_calls_bit_for_bit(h20, source):
    # The planner times a whole workload at once: each element must be the scalar call's,
    # on the paper's stages (catalog) and on measured engine requests (a profile).
    perf = h20 if source == "catalog" else load_perf_model(ROOT / "configs/profiles/tiny-llama-vllm-cpu.json")
    tp = perf.tps[0]
    rng = np.random.default_rng(3)
    hist = np.concatenate([[0, 0], rng.integers(0, 200_000, 500)])
    new = np.concatenate([[1, 5000], rng.integers(1, 20_000, 500)])
    prefill, decode = WorkerSpec(0, Role.PREFILL, tp, 0), WorkerSpec(1, Role.DECODE, tp, 1)
    stages = perf.remote_stages_array_s(hist, new, prefill, decode)
    for i, (h, x) in enumerate(zip(hist.tolist(), new.tolist())):
        assert tuple(float(s[i]) for s in stages) == tuple(perf.remote_stages_s(h, x, prefill, decode))
        assert perf.prefill_array_s(hist, new, tp)[i] == perf.prefill_s(h, x, tp)
    # a model with only the scalar forms gets them task by task
    stub = StubPerf()
    assert stub.prefill_array_s(hist[:3], new[:3], 1).tolist() == [0.001 * 1, 0.001 * 5000, 0.001 * int(new[2])]
    assert [s.tolist() for s in stub.remote_stages_array_s(hist[:2], new[:2], prefill, decode)] == [
        [0.0, 0.0], [0.001 * 1, 0.001 * 5000], [1e-5 * 1, 1e-5 * 5000]]
