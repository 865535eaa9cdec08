"""How many KV tokens a replica holds once its weights are loaded."""

from __future__ import annotations

from ampd.perf.catalog import GpuSpec, ModelSpec, kv_bytes_per_token

# [our choice] Share of GPU memory for weights and KV cache: vLLM's default
# gpu_memory_utilization; the rest is left to activations, CUDA graphs and the allocator.
USABLE_MEMORY_FRACTION = 0.9


def replica_kv_capacity_tokens(spec: ModelSpec, device: GpuSpec, tp: int, kv_bytes: int | None = None) -> int:
    """KV tokens a replica of ``tp`` GPUs holds: (``tp`` x datasheet memory x
    ``USABLE_MEMORY_FRACTION`` - weights) / KV bytes per token; 0 when the weights do not
    fit. Datasheet GB are read as 10^9 bytes (a little below the real GiB-sized memories:
    conservative). ``kv_bytes``: KV bytes of one token when measured (an FP8 cache, say);
    None: ``kv_bytes_per_token(spec)``."""
    free_bytes = tp * device.memory_gb * 1e9 * USABLE_MEMORY_FRACTION - spec.weight_bytes
    return max(0, int(free_bytes // (kv_bytes or kv_bytes_per_token(spec))))
