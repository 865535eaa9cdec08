"""Catalog: lookups, KV bytes per token, parameter counts recomputed from config.json shapes."""

import pytest

from ampd.core.errors import InputError
from ampd.perf.catalog import GPUS, MODELS, gpu, kv_bytes_per_token, model


def _dense_params(layers, hidden, heads, kv_heads, head_dim, inter, vocab, qk_norm=False):
    """Llama-style parameter count from config.json shapes, untied embeddings."""
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    per_layer = attn + 3 * hidden * inter + 2 * hidden + (2 * head_dim if qk_norm else 0)
    return layers * per_layer + 2 * vocab * hidden + hidden


def test_kv_bytes_per_token_by_hand():
    assert kv_bytes_per_token(model("Llama-3.1-70B")) == 2 * 80 * 8 * 128 * 2 == 327_680
    assert kv_bytes_per_token(model("Qwen3-32B")) == 2 * 64 * 8 * 128 * 2 == 262_144
    assert kv_bytes_per_token(model("Mixtral-8x7B")) == 2 * 32 * 8 * 128 * 2 == 131_072
    assert kv_bytes_per_token(model("Llama-3.1-8B")) == 131_072


@pytest.mark.parametrize("name, shapes, qk_norm", [
    ("Llama-3.1-70B", (80, 8192, 64, 8, 128, 28672, 128256), False),
    ("Llama-2-70B", (80, 8192, 64, 8, 128, 28672, 32000), False),
    ("Llama-3.1-8B", (32, 4096, 32, 8, 128, 14336, 128256), False),
    ("Qwen3-32B", (64, 5120, 64, 8, 128, 25600, 151936), True),
])
def test_dense_params_match_config_shapes(name, shapes, qk_norm):
    spec = model(name)
    assert spec.params == spec.active_params == _dense_params(*shapes, qk_norm=qk_norm)


def test_mixtral_params_by_hand():
    spec = model("Mixtral-8x7B")
    attn = 4096 * 4096 * 2 + 4096 * 1024 * 2
    expert = 3 * 4096 * 14336
    per_layer_fixed = attn + 4096 * 8 + 2 * 4096  # attention, router, two norms
    embed = 2 * 32000 * 4096 + 4096
    assert spec.params == 32 * (per_layer_fixed + 8 * expert) + embed
    assert spec.active_params == 32 * (per_layer_fixed + 2 * expert) + embed


def test_lookup_is_case_insensitive():
    assert gpu("h20") is gpu("H20")
    assert model("  llama-3.1-70b ") is model("Llama-3.1-70B")


def test_unknown_names_raise_input_error_naming_them():
    with pytest.raises(InputError, match="B200") as err:
        gpu("B200")
    assert all(g.name in str(err.value) for g in GPUS)
    with pytest.raises(InputError, match="GPT-5") as err:
        model("GPT-5")
    assert all(m.name in str(err.value) for m in MODELS)


def test_datasheet_figures():
    h20 = gpu("H20")
    assert (h20.bf16_dense_tflops, h20.hbm_gb_per_s, h20.memory_gb, h20.nvlink_gb_per_s) == (148, 4000, 96, 900)
    assert gpu("A100-80GB").bf16_dense_tflops == 312


def test_specs_are_frozen():
    with pytest.raises(AttributeError):
        gpu("H20").memory_gb = 1
