"""Roofline on toy hardware with round numbers, every expected value worked out by hand."""

import dataclasses

import pytest

from ampd.core.errors import InputError
from ampd.perf.catalog import GpuSpec, ModelSpec, gpu, model
from ampd.perf.roofline import Efficiency, Roofline

# 1e9 params, one layer, hidden 1000, one head of dim 1: attention costs 4 FLOPs per pair,
# KV 2 (K, V) x 1 x 1 x 1 x 2 bytes = 4 bytes per token.
TOY = ModelSpec("toy", num_layers=1, hidden_size=1000, num_heads=1, num_kv_heads=1, head_dim=1,
                intermediate_size=1, vocab_size=1, params=10**9, active_params=10**9)
COMPUTE_GPU = GpuSpec("fast-memory", bf16_dense_tflops=100, hbm_gb_per_s=1e6, memory_gb=100, nvlink_gb_per_s=200)
MEMORY_GPU = GpuSpec("fast-math", bf16_dense_tflops=1e9, hbm_gb_per_s=1000, memory_gb=100, nvlink_gb_per_s=200)
EFF = Efficiency(compute_eff=0.5, memory_eff=0.5, allreduce_small_eff=0.5, allreduce_large_eff=0.25,
                 allreduce_step_s=1e-6, prefill_fixed_s=0.001, decode_fixed_s=0.01,
                 prefill_per_seq_s=0.002, decode_per_seq_s=0.001)


def test_pure_compute_prefill():
    # FLOPs: 2 x 1e9 x 1000 dense + 4 x 1000 x (0 + 1000/2) attention = 2.000002e12
    # at 100e12 x 0.5 FLOP/s = 0.04000004 s; plus 0.001 fixed + 0.002 per sequence.
    t = Roofline(TOY, COMPUTE_GPU, EFF).prefill_s(0, 1000, tp=1)
    assert t == pytest.approx(0.001 + 0.002 + 0.04000004, rel=1e-12)


def test_batched_prefill_with_history():
    # 2 sequences x 100 new tokens on 900 history: 2 x 2e9 x 100 dense + 4 x 2 x 100 x (900 + 50)
    # = 4.0000076e11 FLOPs -> 0.0080000152 s; fixed 0.001 + 2 x 0.002.
    t = Roofline(TOY, COMPUTE_GPU, EFF).prefill_s(900, 100, tp=1, batch_size=2)
    assert t == pytest.approx(0.005 + 0.0080000152, rel=1e-12)


def test_pure_memory_decode():
    # Bytes: weights 2e9 + KV (1000 context + 1 new) x 4 = 2.000004004e9 at 1000e9 x 0.5 B/s.
    t = Roofline(TOY, MEMORY_GPU, EFF).decode_step_s(1, 1000, tp=1)
    assert t == pytest.approx(0.01 + 0.001 + 0.004000008008, rel=1e-12)


def test_tensor_parallel_all_reduce():
    # TP2: compute halves to 0.02000002 s. Per all-reduce: message 1000 x 1000 x 2 = 2e6 B
    # (<= 32 MiB: small efficiency 0.5); ring moves 2 x 1/2 x 2e6 = 2e6 B per GPU at
    # 200/2 GB/s x 0.5 = 4e-5 s, plus 2 x 1 step x 1e-6 s; 2 all-reduces per layer.
    t = Roofline(TOY, COMPUTE_GPU, EFF).prefill_s(0, 1000, tp=2)
    assert t == pytest.approx(0.003 + 0.02000002 + 2 * (4e-5 + 2e-6), rel=1e-12)


def test_large_all_reduce_messages_use_the_large_efficiency():
    eff = dataclasses.replace(EFF, allreduce_switch_bytes=10**6)  # 2e6 B message is now "large": 0.25
    t = Roofline(TOY, COMPUTE_GPU, eff).prefill_s(0, 1000, tp=2)
    assert t == pytest.approx(0.003 + 0.02000002 + 2 * (8e-5 + 2e-6), rel=1e-12)


def test_moe_reads_only_routed_experts():
    mixtral = model("Mixtral-8x7B")
    roof = Roofline(mixtral, MEMORY_GPU, EFF)
    one = roof.decode_step_s(1, 0, tp=1) - 0.011
    assert one == pytest.approx((12_879_925_248 * 2 + 131_072) / 500e9, rel=1e-9)
    many = roof.decode_step_s(10_000, 0, tp=1) - 0.01 - 10.0
    assert many == pytest.approx((46_702_792_704 * 2 + 131_072 * 10_000) / 500e9, rel=1e-9)
    assert roof.experts_saturated_tokens() == 17  # 0.75^16 > 0.01 >= 0.75^17


def test_ridge_point_at_full_efficiency():
    # H20: 148e12 FLOP/s over 4e12 B/s = 37 FLOP/B; a dense token costs 2 FLOPs per 2-byte weight.
    full = Efficiency(1, 1, 1, 1, 0, 0, 0, 0, 0)
    assert Roofline(model("Llama-3.1-70B"), gpu("H20"), full).ridge_tokens() == pytest.approx(37)


@pytest.mark.parametrize("field, value", [("compute_eff", 0.0), ("memory_eff", 1.5), ("decode_fixed_s", -1e-3)])
def test_impossible_efficiency_is_refused(field, value):
    with pytest.raises(InputError, match=field):
        dataclasses.replace(EFF, **{field: value})


def test_negative_sizes_are_refused():
    with pytest.raises(InputError):
        Roofline(TOY, COMPUTE_GPU, EFF).prefill_s(-1, 10, 1)
    with pytest.raises(InputError):
        Roofline(TOY, COMPUTE_GPU, EFF).decode_step_s(0, 10, 1)
