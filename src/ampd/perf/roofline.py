"""Roofline estimates of one forward pass, scaled by calibrated efficiencies.

One forward on a replica of ``tp`` GPUs takes

    fixed_s + per_seq_s * sequences + max(compute_s, memory_s) + allreduce_s

- ``compute_s``: dense FLOPs (2 x active params per token) plus attention FLOPs
  (QK^T and AV: 4 x layers x heads x head_dim per attended (query, key) pair), over
  ``tp`` GPUs at ``compute_eff`` of the dense BF16 peak.
- ``memory_s``: weights read once per forward (for a MoE only the experts the batch
  routes to, expected under uniform routing) plus the KV cache read and written, over
  ``tp`` GPUs at ``memory_eff`` of the HBM bandwidth. Activations are ignored.
- ``allreduce_s``: Megatron TP runs 2 all-reduces per layer of ``tokens x hidden``
  BF16 values. A ring moves ``2 (tp-1)/tp`` of the message per GPU at one-way NVLink
  bandwidth, with ``2 (tp-1)`` steps of latency. The efficiency differs for messages
  above ``allreduce_switch_bytes``: the measured Splitwise profiles slow down per token
  between 2048 and 4096 tokens at TP 4 and 8 only (see docs/PERF_MODEL.md).
- ``fixed_s`` and ``per_seq_s``: engine overheads (kernel launches, scheduling, sampling),
  distinct for prefill and decode.

Source of the form: the usual LLM inference roofline (e.g. Yuan et al., "LLM Inference
Unveiled", 2024); efficiencies come from ``ampd.perf.calibrate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ampd.core.errors import InputError
from ampd.perf.catalog import GpuSpec, ModelSpec, kv_bytes_per_token

_FRACTIONS = ("compute_eff", "memory_eff", "allreduce_small_eff", "allreduce_large_eff")


@dataclass(frozen=True, slots=True)
class Efficiency:
    """How much of the datasheet peaks an engine reaches, plus its overheads.

    Attributes:
        compute_eff: fraction of the dense BF16 peak reached by matmuls, in (0, 1].
        memory_eff: fraction of HBM bandwidth reached by weight and KV reads, in (0, 1].
        allreduce_small_eff: fraction of one-way NVLink bandwidth an all-reduce reaches
            for messages up to ``allreduce_switch_bytes``, in (0, 1].
        allreduce_large_eff: the same for larger messages, in (0, 1].
        allreduce_step_s: latency of one ring step, seconds.
        prefill_fixed_s, decode_fixed_s: fixed cost of one prefill / decode forward, seconds.
        prefill_per_seq_s, decode_per_seq_s: extra cost per sequence in the batch, seconds.
        allreduce_switch_bytes: message size where the all-reduce efficiency changes.
            Not fitted: the measurements only bracket it between 32 and 64 MiB
            (2048 and 4096 tokens of Llama-2-70B); 32 MiB is taken.

    Raises:
        InputError: a fraction outside (0, 1] or a negative time.
    """

    compute_eff: float
    memory_eff: float
    allreduce_small_eff: float
    allreduce_large_eff: float
    allreduce_step_s: float
    prefill_fixed_s: float
    decode_fixed_s: float
    prefill_per_seq_s: float
    decode_per_seq_s: float
    allreduce_switch_bytes: int = 32 * 2**20

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _FRACTIONS and not 0.0 < value <= 1.0:
                raise InputError(f"efficiency {f.name}={value!r} must be in (0, 1]")
            if f.name not in _FRACTIONS and not value >= 0.0:
                raise InputError(f"efficiency {f.name}={value!r} must be >= 0")


@dataclass(frozen=True, slots=True)
class Roofline:
    """Calibrated roofline of ``model`` on ``gpu``; every result is in seconds."""

    model: ModelSpec
    gpu: GpuSpec
    eff: Efficiency

    def prefill_s(self, hist_tokens: int, new_tokens: int, tp: int, batch_size: int = 1) -> float:
        """Prefill ``batch_size`` sequences, each of ``new_tokens`` new tokens on top of
        ``hist_tokens`` cached ones (causal: new token i attends to hist + i keys).

        Raises:
            InputError: a negative token count, or tp / batch size below 1.
        """
        _check(hist_tokens, new_tokens, tp, batch_size)
        tokens = batch_size * new_tokens
        pairs = batch_size * new_tokens * (hist_tokens + new_tokens / 2)
        kv_bytes = batch_size * (hist_tokens + new_tokens) * kv_bytes_per_token(self.model)
        return (self.eff.prefill_fixed_s + self.eff.prefill_per_seq_s * batch_size
                + self._busy_s(tokens, pairs, kv_bytes, tp))

    def decode_step_s(self, batch_size: int, context_tokens: int, tp: int) -> float:
        """One decode iteration of ``batch_size`` sequences whose KV totals
        ``context_tokens`` tokens (each new token attends to its own sequence's KV).

        Raises:
            InputError: a negative token count, or tp / batch size below 1.
        """
        _check(context_tokens, 0, tp, batch_size)
        kv_bytes = (context_tokens + batch_size) * kv_bytes_per_token(self.model)
        return (self.eff.decode_fixed_s + self.eff.decode_per_seq_s * batch_size
                + self._busy_s(batch_size, context_tokens, kv_bytes, tp))

    def compute_bound_s(self, tokens: int, tp: int) -> float:
        """Dense matmul time of ``tokens`` tokens at 100% of peak: a lower bound on any
        forward of that many tokens, used to reject impossible measurements."""
        return 2 * self.model.active_params * tokens / (tp * self.gpu.bf16_dense_tflops * 1e12)

    def ridge_tokens(self) -> float:
        """Tokens per forward where dense compute time equals the weight-read time: below
        it a forward is memory-bound, above it compute-bound (MoE: with all experts read)."""
        m, g, e = self.model, self.gpu, self.eff
        flops_per_byte = g.bf16_dense_tflops * 1e12 * e.compute_eff / (g.hbm_gb_per_s * 1e9 * e.memory_eff)
        return m.weight_bytes * flops_per_byte / (2 * m.active_params)

    def experts_saturated_tokens(self) -> int:
        """Tokens per forward from which a MoE reads 99% of its experts' weights (uniform
        routing); below it the weight read rises steeply (concave). 1 for a dense model."""
        m = self.model
        if m.num_experts == 1:
            return 1
        return math.ceil(math.log(0.01) / math.log(1 - m.experts_per_token / m.num_experts))

    def _busy_s(self, tokens: int, attended_pairs: float, kv_bytes: float, tp: int) -> float:
        m = self.model
        flops = 2 * m.active_params * tokens + 4 * m.num_layers * m.num_heads * m.head_dim * attended_pairs
        compute_s = flops / (tp * self.gpu.bf16_dense_tflops * 1e12 * self.eff.compute_eff)
        memory_bytes = self._weight_bytes_read(tokens) + kv_bytes
        memory_s = memory_bytes / (tp * self.gpu.hbm_gb_per_s * 1e9 * self.eff.memory_eff)
        return max(compute_s, memory_s) + self._allreduce_s(tokens, tp)

    def _weight_bytes_read(self, tokens: int) -> float:
        m = self.model
        if m.num_experts == 1:
            return m.weight_bytes
        # Expert weights: all experts = (params - active) / (1 - k/E); a batch touches an
        # expert unless every token routes elsewhere, probability (1 - k/E)^tokens.
        routed = m.experts_per_token / m.num_experts
        expert_params = (m.params - m.active_params) / (1 - routed)
        touched = 1 - (1 - routed) ** tokens
        return (m.params - expert_params * (1 - touched)) * m.bytes_per_param

    def _allreduce_s(self, tokens: int, tp: int) -> float:
        if tp == 1 or tokens == 0:
            return 0.0
        message_bytes = tokens * self.model.hidden_size * self.model.bytes_per_param
        eff = (self.eff.allreduce_small_eff if message_bytes <= self.eff.allreduce_switch_bytes
               else self.eff.allreduce_large_eff)
        ring_bytes = 2 * (tp - 1) / tp * message_bytes
        one_way_bytes_per_s = self.gpu.nvlink_gb_per_s / 2 * 1e9 * eff
        per_allreduce_s = 2 * (tp - 1) * self.eff.allreduce_step_s + ring_bytes / one_way_bytes_per_s
        return 2 * self.model.num_layers * per_allreduce_s


def _check(hist_tokens: int, new_tokens: int, tp: int, batch_size: int) -> None:
    if hist_tokens < 0 or new_tokens < 0 or tp < 1 or batch_size < 1:
        raise InputError(f"roofline: need tokens >= 0, tp >= 1, batch >= 1; got hist/context={hist_tokens}, "
                         f"new={new_tokens}, tp={tp}, batch={batch_size}")
