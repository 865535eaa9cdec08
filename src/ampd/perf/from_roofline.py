"""Piecewise alpha-beta cost functions fitted to the calibrated roofline: sample it on a
grid of sizes and fit ``T_pre`` and ``T_dec`` per TP degree."""

from __future__ import annotations

from dataclasses import asdict

from ampd.perf.alphabeta import fit_decode, fit_prefill
from ampd.perf.calibrate import FIT_DATE, FIT_SOURCE, efficiency_of
from ampd.perf.memory import replica_kv_capacity_tokens
from ampd.perf.roofline import Roofline

# [our choice] Segments of T_pre over new tokens and of T_dec over batch size. The roofline's
# own kinks are added per model and GPU, so no segment straddles one: its ridge point
# (memory- to compute-bound, e.g. 28 tokens for Llama-3.1-70B on H20); for a MoE, doublings
# up to where all experts are read (2, 4, 8, 16, 17 for Mixtral); for T_pre, the size where the
# all-reduce efficiency steps (2048 tokens for Llama-70B).
PREFILL_BREAKPOINTS_TOKENS = (256, 1024, 4096)
DECODE_BREAKPOINTS = (8, 32, 128)

# Sample grid. New tokens: 8 steps per doubling from 1 to 32768 (plus each breakpoint and
# the size after it); history up to 32k tokens. Decode: batch 1..512 and context per
# sequence up to 32k tokens, kept within the replica's KV capacity.
_MAX_NEW_TOKENS = 32768
_HIST_TOKENS = (0, 512, 2048, 8192, 32768)
_MAX_BATCH = 512
_CONTEXT_PER_SEQ_TOKENS = (128, 512, 2048, 8192, 32768)


def fit_from_roofline(roof: Roofline, tps: tuple[int, ...]) -> tuple[dict, dict, dict]:
    """``T_pre`` and ``T_dec`` per TP degree fitted to the roofline on the sample grid.

    Returns:
        ``(prefill, decode, report)``: ``PrefillCost`` and ``DecodeCost`` per TP, and a
        JSON-ready report (efficiency used, its source, error against the samples).
    """
    eff = roof.eff
    kinks = ({round(roof.ridge_tokens())} | _doublings(roof.experts_saturated_tokens())) - {0, 1}
    switch_tokens = eff.allreduce_switch_bytes // (roof.model.hidden_size * roof.model.bytes_per_param)
    prefill_breaks = tuple(sorted(set(PREFILL_BREAKPOINTS_TOKENS) | {switch_tokens} | kinks))
    decode_breaks = tuple(sorted(set(DECODE_BREAKPOINTS) | kinks))
    prefill, decode, errors = {}, {}, {}
    for tp in tps:
        pre_samples = prefill_samples(roof, tp, prefill_breaks)
        dec_samples = decode_samples(roof, tp, decode_breaks, replica_kv_capacity_tokens(roof.model, roof.gpu, tp))
        prefill[tp] = fit_prefill(pre_samples, prefill_breaks)
        decode[tp] = fit_decode(dec_samples, decode_breaks)
        errors[str(tp)] = {"prefill": _errors(prefill[tp], pre_samples), "decode": _errors(decode[tp], dec_samples)}
    report = {"efficiency": asdict(eff), "efficiency_of": efficiency_of(roof.gpu.name),
              "calibrated": FIT_DATE, "calibration_source": FIT_SOURCE,
              "error_vs_roofline_samples": errors}
    return prefill, decode, report


def prefill_samples(roof: Roofline, tp: int, breakpoints: tuple[int, ...]) -> list[tuple[int, int, float]]:
    """``(hist_tokens, new_tokens, roofline seconds)`` over the sample grid."""
    sizes = sorted(set(_geometric(_MAX_NEW_TOKENS)) | set(breakpoints) | {b + 1 for b in breakpoints})
    return [(hist, new, roof.prefill_s(hist, new, tp)) for hist in _HIST_TOKENS for new in sizes]


def decode_samples(roof: Roofline, tp: int, breakpoints: tuple[int, ...],
                   capacity_tokens: int) -> list[tuple[int, int, float]]:
    """``(batch_size, context_tokens, roofline seconds)`` over the sample grid; contexts
    beyond ``capacity_tokens`` are skipped, except the shortest (so every batch size is
    sampled even where the weights leave no room)."""
    batches = sorted(set(_geometric(_MAX_BATCH)) | set(breakpoints) | {b + 1 for b in breakpoints})
    samples = []
    for b in batches:
        for per_seq in _CONTEXT_PER_SEQ_TOKENS:
            if per_seq == _CONTEXT_PER_SEQ_TOKENS[0] or b * per_seq <= capacity_tokens:
                samples.append((b, b * per_seq, roof.decode_step_s(b, b * per_seq, tp)))
    return samples


def _geometric(top: int) -> list[int]:
    """Integers from 1 to ``top`` at 8 steps per doubling."""
    values, x = set(), 1.0
    while x <= top:
        values.add(round(x))
        x *= 2 ** (1 / 8)
    return sorted(values | {top})


def _doublings(top: int) -> set[int]:
    """2, 4, 8, ... below ``top``, and ``top`` itself."""
    return {2**i for i in range(1, top.bit_length()) if 2**i < top} | {top}


def _errors(cost, samples: list[tuple[int, int, float]]) -> dict:
    rel = [abs(cost(a, b) / t - 1) for a, b, t in samples]
    return {"mape": sum(rel) / len(rel), "max_rel_error": max(rel), "num_samples": len(rel)}
