"""``model_from_hf_config``: a ``ModelSpec`` from a Hugging Face ``config.json``, for a model
outside the catalog (docs/PERF_MODEL.md section 2a).

Key names are those of transformers' configuration classes (``LlamaConfig``,
``MixtralConfig``, ``Qwen3Config``, ``Qwen3MoeConfig``). Parameter counts follow the catalog's
rule (``catalog.MODELS``' comments; ``tests/test_perf_catalog.py``): a Llama-style decoder whose
weights are the embeddings, per layer the q/k/v/o projections (GQA: k and v of
``num_key_value_heads`` heads), the gated MLP (gate, up, down) or, for a MoE, a router and
that many expert MLPs, two RMSNorms, plus the final norm and the LM head unless tied.
Biases are not counted (Llama, Mistral and Qwen3 have none).
"""

from __future__ import annotations

import json
from pathlib import Path

from ampd.core.errors import InputError
from ampd.perf.catalog import ModelSpec
from ampd.perf.spec_json import check_field, model_spec_from_dict

CONFIG_FILE = "config.json"

# Bytes of one weight (and one KV-cache value) per ``torch_dtype``; transformers 5 writes the
# same value under ``dtype``.
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# [our choice] No dtype in the file: 2 bytes, the BF16/FP16 every catalog model ships in and
# engines serve by default.
_DEFAULT_BYTES_PER_PARAM = 2

# Families whose attention has an RMSNorm of ``head_dim`` weights on q and on k in every
# layer although their config.json has no key saying so (transformers' modeling_qwen3.py and
# modeling_qwen3_moe.py, ``q_norm`` and ``k_norm``).
_QK_NORM_MODEL_TYPES = frozenset({"qwen3", "qwen3_moe"})

# Keys of architectures this count would get wrong, refused rather than miscounted: the field,
# then why.
_UNSUPPORTED = {
    "kv_lora_rank": "multi-head latent attention (DeepSeek): its KV cache and projections are not "
                    "per-head K and V",
    "n_shared_experts": "shared experts are not counted",
    "shared_expert_intermediate_size": "shared experts are not counted",
    "quantization_config": "quantized weights do not take torch_dtype's bytes per weight",
}


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """The ``ModelSpec`` of the model whose Hugging Face ``config.json`` is ``path`` (the file,
    or the folder holding it, as ``huggingface-cli download MODEL config.json`` leaves it).

    Read: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
    ``num_key_value_heads`` (default: the attention heads, i.e. no GQA), ``head_dim`` (default:
    hidden / heads), ``intermediate_size``, ``vocab_size``, ``tie_word_embeddings`` (default
    false, as in ``LlamaConfig``, ``MixtralConfig`` and ``Qwen3Config``), ``torch_dtype`` or ``dtype`` (bfloat16/float16: 2 bytes, float32: 4; absent: 2),
    and for a MoE ``num_local_experts`` (Mixtral) or ``num_experts`` (Qwen-MoE),
    ``num_experts_per_tok`` and, when present, ``moe_intermediate_size`` (an expert's MLP
    width, then the spec's ``intermediate_size``). Name: ``_name_or_path`` when the file has
    one, else the folder's name.

    Raises:
        InputError: the file cannot be read or is not a JSON object; a field missing or not a
            positive integer (of the right type); heads not a multiple of KV heads; no
            ``head_dim`` and a hidden size that the heads do not divide; an unknown dtype; an
            architecture this count does not cover (``_UNSUPPORTED``). The message starts with
            the file and names the field, e.g. ``…/config.json: missing 'hidden_size'``.
    """
    file = Path(path)
    if file.is_dir():
        file = file / CONFIG_FILE
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{file}: cannot read the model's config.json: {getattr(exc, 'strerror', None) or exc}") \
            from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{file}: not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise InputError(f"{file}: expected a JSON object at the top, got {type(config).__name__}")
    try:
        return _spec(config, file)
    except InputError as exc:
        raise InputError(f"{file}: {exc}") from None


def _spec(config: dict, file: Path) -> ModelSpec:
    for key, why in _UNSUPPORTED.items():
        if config.get(key):
            raise InputError(f"{key!r} is not supported: {why}")

    def field(key: str, default: int | None = None) -> int:
        if config.get(key) is None:  # transformers writes an unset option as null
            if default is None:
                raise InputError(f"missing {key!r}")
            return default
        return check_field(key, "int", config[key])

    layers, hidden, vocab = field("num_hidden_layers"), field("hidden_size"), field("vocab_size")
    heads = field("num_attention_heads")
    kv_heads = field("num_key_value_heads", heads)
    if heads % kv_heads:
        raise InputError(f"num_key_value_heads: {kv_heads} does not divide num_attention_heads ({heads})")
    if config.get("head_dim") is None and hidden % heads:
        raise InputError(f"missing 'head_dim', and hidden_size ({hidden}) is not a multiple of "
                         f"num_attention_heads ({heads})")
    head_dim = field("head_dim", hidden // heads)
    # A dense model has no experts key, or one set to null or 0 (transformers' "no MoE").
    experts_key = next((k for k in ("num_local_experts", "num_experts") if config.get(k)), None)
    moe = experts_key is not None
    experts = field(experts_key) if moe else 1
    per_token = field("num_experts_per_tok") if moe else 1
    # A MoE's expert MLPs may be narrower than the dense width the file also gives (Qwen3-MoE).
    mlp_width = field("moe_intermediate_size") if moe and config.get("moe_intermediate_size") is not None \
        else field("intermediate_size")
    tied = config.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise InputError(f"tie_word_embeddings: expected true or false, got {tied!r}")
    qk_norm = isinstance(config.get("model_type"), str) and config["model_type"] in _QK_NORM_MODEL_TYPES

    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim  # q, o; k, v
    expert = 3 * hidden * mlp_width  # gate, up, down
    router = hidden * experts if moe else 0  # the gate scoring each expert
    shared = attention + router + 2 * hidden + (2 * head_dim if qk_norm else 0)  # + 2 RMSNorms
    outside = vocab * hidden * (1 if tied else 2) + hidden  # embeddings, LM head, final norm
    params = layers * (shared + experts * expert) + outside
    active = layers * (shared + per_token * expert) + outside

    name = config.get("_name_or_path") or file.resolve().parent.name
    # The shared spec reader checks what the fields must satisfy together (experts per token
    # at most the experts), with the rest of every spec file's rules.
    return model_spec_from_dict({
        "name": name, "num_layers": layers, "hidden_size": hidden, "num_heads": heads, "num_kv_heads": kv_heads,
        "head_dim": head_dim, "intermediate_size": mlp_width, "vocab_size": vocab, "params": params,
        "active_params": active, "num_experts": experts, "experts_per_token": per_token,
        "bytes_per_param": _bytes_per_param(config)})


def _bytes_per_param(config: dict) -> int:
    key = "torch_dtype" if config.get("torch_dtype") is not None else "dtype"
    dtype = config.get(key)
    if dtype is None:
        return _DEFAULT_BYTES_PER_PARAM
    if dtype not in _DTYPE_BYTES:
        raise InputError(f"{key}: {dtype!r} is not one of {', '.join(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[dtype]
