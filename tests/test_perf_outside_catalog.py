"""Models and GPUs outside the catalog (issue 11, item 3): a Hugging Face config.json, a GPU
TOML, one resolver for names and paths, and a simulation run on both.

The config.json fixtures in tests/data/hf_configs/ are the published files' keys, typed by hand
(meta-llama/Llama-3.1-8B and -70B, Qwen/Qwen3-32B, mistralai/Mixtral-8x7B-v0.1), and
src/ampd/engines/tiny_model.py's output."""

import json
import socket
import tomllib
from pathlib import Path

import pytest

from ampd.cli.main import main
from ampd.config import parse_config
from ampd.core.errors import InputError
from ampd.perf import build_perf_model, catalog
from ampd.perf.calibrate import CALIBRATED, efficiency_for, efficiency_of
from ampd.perf.gpu_file import gpu_from_toml
from ampd.perf.hf_config import model_from_hf_config
from ampd.perf.resolve import resolve_gpu, resolve_model

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "tests" / "data" / "hf_configs"
H100_PCIE = ROOT / "configs" / "gpus" / "h100-pcie.toml"

LLAMA_8B = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16"}


def _write(tmp_path: Path, config: dict, folder: str = "m") -> Path:
    path = tmp_path / folder / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize("name", ["Llama-3.1-8B", "Llama-3.1-70B", "Qwen3-32B", "Mixtral-8x7B"])
def test_published_configs_give_the_catalog_specs(name):
    # Every field, params and active params included; the name is the folder's.
    assert model_from_hf_config(CONFIGS / name) == catalog.model(name)


def test_llama_8b_params_by_hand():
    spec = model_from_hf_config(CONFIGS / "Llama-3.1-8B" / "config.json")
    q_o = 2 * 4096 * 4096             # 32 heads x 128 = 4096
    k_v = 2 * 4096 * 1024             # 8 KV heads x 128 = 1024
    mlp = 3 * 4096 * 14336            # gate, up, down
    layer = q_o + k_v + mlp + 2 * 4096  # + 2 RMSNorms = 218,112,000
    assert layer == 218_112_000
    assert spec.params == 32 * 218_112_000 + 2 * 128256 * 4096 + 4096 == 8_030_261_248


def test_the_tiny_model_loads_with_float32_weights():
    # src/ampd/engines/tiny_model.py's config (transformers 5 writes "dtype"). Its model.safetensors
    # holds 950,912 float32 values in all (summed from the tensor shapes in its header).
    spec = model_from_hf_config(CONFIGS / "tiny-llama")
    layer = 2 * 128 * 128 + 2 * 128 * 128 + 3 * 128 * 384 + 2 * 128  # q, o; k, v (2 KV heads x 64); MLP; norms
    assert layer == 213_248
    assert spec.params == spec.active_params == 2 * layer + 2 * 2048 * 128 + 128 == 950_912
    assert (spec.name, spec.head_dim, spec.bytes_per_param) == ("tiny-llama", 64, 4)


def test_moe_with_narrow_experts_tied_embeddings_and_qk_norm(tmp_path):
    # A Qwen3-MoE-shaped toy: the experts' width is moe_intermediate_size (3), not the
    # dense intermediate_size; q/k RMSNorms of head_dim; one matrix for embeddings and LM head.
    path = _write(tmp_path, {
        "model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 100, "moe_intermediate_size": 3,
        "num_experts": 4, "num_experts_per_tok": 2, "vocab_size": 10, "tie_word_embeddings": True})
    spec = model_from_hf_config(path)
    # attention 2*8*2*4 + 2*8*1*4 = 192; router 8*4 = 32; norms 2*8 + q/k 2*4 = 24: shared 248.
    # expert 3*8*3 = 72. outside the layers: 10*8 (tied) + 8 = 88.
    assert spec.params == 2 * (248 + 4 * 72) + 88 == 1160
    assert spec.active_params == 2 * (248 + 2 * 72) + 88 == 872
    assert (spec.num_experts, spec.experts_per_token, spec.intermediate_size) == (4, 2, 3)


def test_defaults_name_and_dtype(tmp_path):
    bare = {k: v for k, v in LLAMA_8B.items() if k not in ("num_key_value_heads", "torch_dtype")}
    spec = model_from_hf_config(_write(tmp_path, bare, "my-model"))
    assert (spec.name, spec.num_kv_heads, spec.head_dim, spec.bytes_per_param) == ("my-model", 32, 128, 2)
    named = model_from_hf_config(_write(tmp_path, {**LLAMA_8B, "_name_or_path": "org/llama", "torch_dtype": "float16"}))
    assert (named.name, named.bytes_per_param) == ("org/llama", 2)


@pytest.mark.parametrize("change, field", [
    ({"hidden_size": None}, "missing 'hidden_size'"),
    ({"num_hidden_layers": "32"}, "num_hidden_layers: expected an integer > 0, got '32'"),
    ({"vocab_size": 0}, "vocab_size: expected an integer > 0"),
    ({"num_key_value_heads": 5}, "num_key_value_heads: 5 does not divide num_attention_heads (32)"),
    ({"num_attention_heads": 3, "num_key_value_heads": 1}, "missing 'head_dim', and hidden_size (4096) is not a multiple"),
    ({"num_local_experts": 8}, "missing 'num_experts_per_tok'"),
    ({"num_local_experts": 2, "num_experts_per_tok": 3}, "model.experts_per_token: 3 is more than num_experts"),
    ({"torch_dtype": "int8"}, "torch_dtype: 'int8' is not one of bfloat16, float16, float32"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings: expected true or false"),
    ({"kv_lora_rank": 512}, "'kv_lora_rank' is not supported: multi-head latent attention"),
])
def test_config_errors_name_the_file_and_field(tmp_path, change, field):
    config = {k: v for k, v in {**LLAMA_8B, **change}.items() if v is not None}
    path = _write(tmp_path, config)
    with pytest.raises(InputError) as err:
        model_from_hf_config(path)
    assert str(err.value).startswith(f"{path}: ") and field in str(err.value)


def test_unreadable_config_files(tmp_path):
    with pytest.raises(InputError, match="config.json: cannot read"):
        model_from_hf_config(tmp_path)  # a folder without config.json
    (tmp_path / "config.json").write_text("{nope")
    with pytest.raises(InputError, match="config.json: not valid JSON"):
        model_from_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(InputError, match="expected a JSON object at the top, got list"):
        model_from_hf_config(tmp_path)


def test_the_example_gpu_file():
    spec = gpu_from_toml(H100_PCIE)
    assert (spec.name, spec.bf16_dense_tflops, spec.hbm_gb_per_s, spec.memory_gb, spec.nvlink_gb_per_s) == \
        ("H100-PCIe", 756.5, 2000.0, 80.0, 128.0)


@pytest.mark.parametrize("text, message", [
    ('name = "X"\nbf16_dense_tflops = 1\nmemory_gb = 1\nnvlink_gb_per_s = 1', "gpu: missing 'hbm_gb_per_s'"),
    ('name = "X"\nbf16_dense_tflops = 1\nhbm_gb_per_s = -3\nmemory_gb = 1\nnvlink_gb_per_s = 1',
     "gpu.hbm_gb_per_s: expected a number > 0, got -3"),
    ('name = "X"\nbf16_dense_tflops = "fast"\nhbm_gb_per_s = 1\nmemory_gb = 1\nnvlink_gb_per_s = 1',
     "gpu.bf16_dense_tflops: expected a number > 0"),
    ('name = "X"\nbf16_dense_tflops = 1\nhbm_gb_per_s = 1\nmemory_gb = 1\nnvlink_gb_per_s = 1\nmemory_gib = 2',
     "gpu: unknown field 'memory_gib'"),
    ("name = ", "not valid TOML"),
])
def test_gpu_file_errors_name_the_file_and_field(tmp_path, text, message):
    path = tmp_path / "gpu.toml"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        gpu_from_toml(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_resolver_takes_names_and_paths():
    assert resolve_model(" llama-3.1-8b ") is catalog.model("Llama-3.1-8B")
    assert resolve_model(str(CONFIGS / "Qwen3-32B")) == catalog.model("Qwen3-32B")
    assert resolve_gpu("h20") is catalog.gpu("H20")
    assert resolve_gpu(str(H100_PCIE)).name == "H100-PCIe"


def test_resolver_errors():
    # An unknown name still lists the catalog, closest first, and says a file would do.
    with pytest.raises(InputError, match=r"unknown model 'Qwen2.5-72B'; known \(closest first\): .*Llama-3.1-70B.*"
                                         r"; or a path to a Hugging Face config.json"):
        resolve_model("Qwen2.5-72B")
    with pytest.raises(InputError, match=r"unknown GPU 'B200'.*H20.*; or a path to a TOML file"):
        resolve_gpu("B200")
    # Written as a path: reported as a missing file, not as an unknown name.
    with pytest.raises(InputError, match="nosuch/config.json: cannot read"):
        resolve_model("nosuch/config.json")
    with pytest.raises(InputError, match="l4.toml: cannot read the GPU file"):
        resolve_gpu("l4.toml")


def test_perf_model_from_files_is_the_catalogs_and_cached():
    # Equal specs are one cache key: the config.json of a catalog model builds the very
    # model its catalog name does.
    by_name = build_perf_model("Llama-3.1-8B", "H20", tps=(1,))
    assert build_perf_model(str(CONFIGS / "Llama-3.1-8B"), "H20", tps=(1,)) is by_name


def test_a_gpu_outside_the_catalog_borrows_h100_sxm_efficiencies():
    assert efficiency_of("H100-PCIe") == "H100-SXM" and efficiency_for("H100-PCIe") is CALIBRATED["H100-SXM"]
    assert efficiency_of("l40s") == "A100-80GB"
    perf = build_perf_model(str(CONFIGS / "Llama-3.1-8B"), str(H100_PCIE), tps=(1,))
    assert perf.gpu.name == "H100-PCIe" and perf.fit_report["efficiency_of"] == "H100-SXM"
    # Same model, a slower memory than H100-SXM's 3.35 TB/s: a decode step takes longer.
    sxm = build_perf_model("Llama-3.1-8B", "H100-SXM", tps=(1,))
    assert perf.decode_step_s(8, 1000, 1) > sxm.decode_step_s(8, 1000, 1)


def test_config_validates_files_and_names_the_field(tmp_path):
    config = parse_config({"cluster": {"model": str(CONFIGS / "tiny-llama"), "gpu": str(H100_PCIE)}})
    assert config.cluster.model == str(CONFIGS / "tiny-llama")
    bad = _write(tmp_path, {"hidden_size": 8})
    with pytest.raises(InputError, match=r"cluster.model.*config.json: missing 'num_hidden_layers'"):
        parse_config({"cluster": {"model": str(bad)}})


def test_simulate_a_config_json_model_on_a_toml_gpu(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text(f"""
system = "ampd"
[cluster]
model = "{CONFIGS / 'Llama-3.1-8B' / 'config.json'}"
gpu = "{H100_PCIE}"
num_gpus = 2
deployment = "P:<TP=1,DP=1> D:<TP=1,DP=1>"
[workload]
name = "toolbench"
num_sessions = 10
rate_per_s = 1.0
""")
    assert main(["simulate", "--config", str(toml), "--out", str(tmp_path / "o")]) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["num_complete"] == 10


def test_the_documented_configuration_is_accepted(monkeypatch):
    # docs/CONFIG.md's "Outside the catalog" example, read from the repository root as documented.
    text = (ROOT / "docs" / "CONFIG.md").read_text().split("## Outside the catalog", 1)[1]
    block = text.split("```toml\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(ROOT)
    cluster = parse_config(tomllib.loads(block)).cluster
    assert resolve_model(cluster.model) == catalog.model("Llama-3.1-8B")
    assert resolve_gpu(cluster.gpu).name == "H100-PCIe"


def test_ampd_profile_takes_the_same_files(tmp_path, capsys):
    # No engine listens at the URL: a run that reaches it has read both files.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()
    files = ["--model", str(CONFIGS / "tiny-llama"), "--gpu", str(H100_PCIE)]
    assert main(["profile", "--decode-url", url, *files, "--quiet", "--out", str(tmp_path)]) == 2
    assert url in capsys.readouterr().err
    assert main(["profile", "--decode-url", url, "--model", "nosuch/config.json", "--gpu", "H20", "--quiet",
                 "--out", str(tmp_path)]) == 2
    assert "nosuch/config.json: cannot read the model's config.json" in capsys.readouterr().err
