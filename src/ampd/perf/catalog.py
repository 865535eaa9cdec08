"""Hardware and model catalog: the numbers every estimate starts from.

Every figure cites its source: the vendor datasheet for GPUs, the model's Hugging Face
``config.json`` for shapes. Parameter counts are computed from those shapes (and agree
with the model cards); ``tests/test_perf_catalog.py`` recomputes them independently.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampd.core.errors import InputError
from ampd.core.names import unknown_name


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU type, from its vendor datasheet.

    Attributes:
        name: catalog name, e.g. ``"H20"``.
        bf16_dense_tflops: peak dense BF16 tensor throughput (the datasheet's figure
            "with sparsity" halved), in 10^12 FLOP/s.
        hbm_gb_per_s: peak device-memory bandwidth, in 10^9 bytes/s.
        memory_gb: device memory as the datasheet states it, in 10^9 bytes.
        nvlink_gb_per_s: GPU-to-GPU bandwidth inside a server as the datasheet states it:
            the total of both directions (a one-way copy gets half).
    """

    name: str
    bf16_dense_tflops: float
    hbm_gb_per_s: float
    memory_gb: float
    nvlink_gb_per_s: float


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model's shape, from its Hugging Face ``config.json``.

    Attributes:
        name: catalog name, e.g. ``"Llama-3.1-70B"``.
        num_layers, hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size,
            vocab_size: as in ``config.json`` (``head_dim`` = hidden / heads when absent).
        params: all parameters (weights held in GPU memory).
        active_params: parameters one token multiplies through (= ``params`` for a dense
            model; shared layers plus ``experts_per_token`` experts for a MoE).
        num_experts, experts_per_token: MoE routing (1 and 1 for a dense model).
        bytes_per_param: 2 (BF16 weights and KV cache).
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    params: int
    active_params: int
    num_experts: int = 1
    experts_per_token: int = 1
    bytes_per_param: int = 2

    @property
    def weight_bytes(self) -> int:
        """Bytes of all weights of one replica (summed over its TP shards)."""
        return self.params * self.bytes_per_param


GPUS: tuple[GpuSpec, ...] = (
    # NVIDIA H20 datasheet (2024): BF16 tensor 148 TFLOPS dense, 96 GB HBM3 at 4.0 TB/s,
    # NVLink 900 GB/s (AMPD.md section 4 uses the same 96 GB and 900 GB/s).
    GpuSpec("H20", bf16_dense_tflops=148.0, hbm_gb_per_s=4000.0, memory_gb=96.0, nvlink_gb_per_s=900.0),
    # NVIDIA H100 Tensor Core GPU datasheet, SXM5 column: BF16 1,979 TFLOPS with sparsity
    # (989.5 dense), 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s.
    GpuSpec("H100-SXM", bf16_dense_tflops=989.5, hbm_gb_per_s=3350.0, memory_gb=80.0, nvlink_gb_per_s=900.0),
    # NVIDIA H200 Tensor Core GPU datasheet, SXM column: BF16 1,979 TFLOPS with sparsity
    # (989.5 dense), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s.
    GpuSpec("H200", bf16_dense_tflops=989.5, hbm_gb_per_s=4800.0, memory_gb=141.0, nvlink_gb_per_s=900.0),
    # NVIDIA A100 Tensor Core GPU datasheet, 80GB SXM column: BF16 312 TFLOPS dense
    # (624 with sparsity), 80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s.
    GpuSpec("A100-80GB", bf16_dense_tflops=312.0, hbm_gb_per_s=2039.0, memory_gb=80.0, nvlink_gb_per_s=600.0),
    # NVIDIA L40S datasheet: BF16 tensor 362.05 TFLOPS dense (733 with sparsity), 48 GB GDDR6
    # at 864 GB/s. No NVLink: peers talk over PCIe Gen4 x16, 64 GB/s both directions.
    GpuSpec("L40S", bf16_dense_tflops=362.05, hbm_gb_per_s=864.0, memory_gb=48.0, nvlink_gb_per_s=64.0),
)

MODELS: tuple[ModelSpec, ...] = (
    # meta-llama/Llama-3.1-70B config.json: 80 layers, hidden 8192, 64 heads, 8 KV heads,
    # head_dim 128, intermediate 28672, vocab 128256, untied embeddings.
    # Params from those shapes: 70,553,706,496 (model card: 70B).
    ModelSpec("Llama-3.1-70B", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8, head_dim=128,
              intermediate_size=28672, vocab_size=128256, params=70_553_706_496, active_params=70_553_706_496),
    # Qwen/Qwen3-32B config.json: 64 layers, hidden 5120, 64 heads, 8 KV heads, head_dim 128,
    # intermediate 25600, vocab 151936, untied embeddings, q/k RMSNorm of head_dim.
    # Params from those shapes: 32,762,123,264 (model card: 32.8B).
    ModelSpec("Qwen3-32B", num_layers=64, hidden_size=5120, num_heads=64, num_kv_heads=8, head_dim=128,
              intermediate_size=25600, vocab_size=151936, params=32_762_123_264, active_params=32_762_123_264),
    # mistralai/Mixtral-8x7B-v0.1 config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads,
    # head_dim 128, intermediate 14336, vocab 32000, 8 local experts, 2 experts per token.
    # Params from those shapes: 46,702,792,704 total, 12,879,925,248 active (Mistral AI's
    # announcement: 46.7B total, 12.9B per token).
    ModelSpec("Mixtral-8x7B", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
              intermediate_size=14336, vocab_size=32000, params=46_702_792_704, active_params=12_879_925_248,
              num_experts=8, experts_per_token=2),
    # meta-llama/Llama-3.1-8B config.json: 32 layers, hidden 4096, 32 heads, 8 KV heads,
    # head_dim 128, intermediate 14336, vocab 128256, untied embeddings.
    # Params from those shapes: 8,030,261,248 (model card: 8B).
    ModelSpec("Llama-3.1-8B", num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128,
              intermediate_size=14336, vocab_size=128256, params=8_030_261_248, active_params=8_030_261_248),
    # meta-llama/Llama-2-70b-hf config.json: 80 layers, hidden 8192, 64 heads, 8 KV heads,
    # head_dim 128, intermediate 28672, vocab 32000. Params from those shapes: 68,976,648,192.
    # The model of the measured Splitwise profiles (calibration only).
    ModelSpec("Llama-2-70B", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8, head_dim=128,
              intermediate_size=28672, vocab_size=32000, params=68_976_648_192, active_params=68_976_648_192),
)


def _lookup(kind: str, name: str, table: tuple) -> object:
    by_key = {entry.name.lower(): entry for entry in table}
    found = by_key.get(str(name).strip().lower())
    if found is None:
        raise InputError(unknown_name(kind, name, (entry.name for entry in table)))
    return found


def gpu(name: str) -> GpuSpec:
    """The catalog GPU called ``name`` (case-insensitive).

    Raises:
        InputError: no such GPU; the message names it and lists the known ones,
        closest first.
    """
    return _lookup("GPU", name, GPUS)


def model(name: str) -> ModelSpec:
    """The catalog model called ``name`` (case-insensitive).

    Raises:
        InputError: no such model; the message names it and lists the known ones,
        closest first.
    """
    return _lookup("model", name, MODELS)


def kv_bytes_per_token(spec: ModelSpec) -> int:
    """KV cache bytes of one token, whole model: K and V x layers x KV heads x head_dim
    x bytes per value (BF16: 2). E.g. Llama-3.1-70B: 2 x 80 x 8 x 128 x 2 = 327,680."""
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * spec.bytes_per_param
