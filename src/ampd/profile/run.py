"""``ampd profile``: measure running engines on a grid, fit AMPD's cost model, write
``profile.json`` and its plots.

What runs where: ``T_pre``, ``T_dec`` and the mixed batch on the decode engine (a
decode engine serves local prefills too, so it answers plain requests; a prefill
engine behind a KV connector may not); ``T_kv`` from the prefill engine to the decode
engine when a prefill engine is given; the serving path of one request on the decode
engine (``ampd.profile.overhead_probe``). Probes run one at a time, never overlapping,
so each engine-side reading belongs to one probe.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from tqdm import tqdm

from ampd.core.errors import InputError
from ampd.profile.decode_probe import (DecodePoint, MixedPoint, chunk_budget_tokens, measure_decode,
                                      measure_mixed, search_chunk_budget)
from ampd.profile.engine import ProbedEngine, connect
from ampd.profile.fit import fit_decode_points, fit_kv_points, fit_prefill_points
from ampd.profile.kv_probe import KvPoint, measure_kv
from ampd.profile.overhead_probe import OverheadPoint, measure_overhead
from ampd.profile.prefill_probe import PrefillPoint, measure_prefill


@dataclass(frozen=True)
class ProfileGrid:
    """What a profile measures ([our choice] defaults: a tiny model on 2 CPU cores
    profiles in a few minutes; a GPU engine takes longer grids, see docs/PROFILING.md).

    Sizes that do not fit the engine's ``max_model_len`` are dropped.

    Attributes:
        hist_tokens, new_tokens: the ``T_pre`` grid (every pair), tokens.
        batch_sizes, decode_prompt_tokens: the ``T_dec`` grid (every pair).
        decode_output_tokens: tokens each request of a decode probe generates (and the
            mixed probe's streams at first).
        kv_tokens: prompt sizes of the ``T_kv`` probes, tokens.
        mixed_batch_size, mixed_new_tokens: the mixed-batch probe: streams running,
            and the local prefill that joins them, tokens.
        overhead_probes: serving-path probes per repeat (their median is the
            profile's ``request_overhead_s``).
        repeats: probes per grid point (their median is fitted).
        warmup: unmeasured probes first (first requests compile kernels, first
            transfers make the NIXL handshake).
        chunk_tokens: the decode engine's token budget per step when known (vLLM's
            ``--max-num-batched-tokens``, which it does not report over HTTP); the
            mixed probe then runs once, to tell chunks from a pause, and the budget
            is taken from here rather than searched for. None: searched (a binary
            search of single mixed probes, which a noisy machine can mislead:
            docs/PROFILING.md, "Pitfalls met").
    """

    hist_tokens: tuple[int, ...] = (0, 256, 1024, 2048)
    new_tokens: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048)
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    decode_prompt_tokens: tuple[int, ...] = (128, 512, 1024)
    decode_output_tokens: int = 256
    kv_tokens: tuple[int, ...] = (128, 256, 512, 1024, 2048)
    mixed_batch_size: int = 4
    mixed_new_tokens: int = 3072
    overhead_probes: int = 4
    repeats: int = 3
    warmup: int = 2
    chunk_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.chunk_tokens is not None and self.chunk_tokens <= self.mixed_batch_size:
            raise InputError(f"profile grid: chunk_tokens must exceed mixed_batch_size {self.mixed_batch_size}, "
                             f"got {self.chunk_tokens}")
        for name in ("repeats", "mixed_batch_size", "mixed_new_tokens", "overhead_probes"):
            if getattr(self, name) < 1:
                raise InputError(f"profile grid: {name} must be >= 1, got {getattr(self, name)}")
        if self.decode_output_tokens < 8:
            raise InputError(f"profile grid: decode_output_tokens must be >= 8, got {self.decode_output_tokens}")


@dataclass
class Measurements:
    """Every point a profile took (repeats included)."""

    prefill: list[PrefillPoint] = dataclasses.field(default_factory=list)
    decode: list[DecodePoint] = dataclasses.field(default_factory=list)
    kv: list[KvPoint] = dataclasses.field(default_factory=list)
    mixed: list[MixedPoint] = dataclasses.field(default_factory=list)
    overhead: list[OverheadPoint] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, list[dict]]:
        return {name: [dataclasses.asdict(p) for p in getattr(self, name)]
                for name in ("prefill", "decode", "kv", "mixed", "overhead")}


async def measure(decode_url: str, prefill_url: str | None, grid: ProfileGrid, seed: int,
                  show_progress: bool = True) -> tuple[Measurements, dict[str, Any]]:
    """Run every probe of ``grid``; the points and the engines' fingerprints.

    Raises:
        ProbeError: an engine failed a probe (the message names it and why).
    """
    rng = np.random.default_rng(seed)
    async with httpx.AsyncClient(timeout=60.0) as client:
        decode, decode_print = await connect(decode_url, client, rng)
        prefill, prefill_print = await connect(prefill_url, client, rng) if prefill_url else (None, None)
        limit = int(decode_print.get("max_model_len") or 1 << 30)
        points = Measurements()
        plan = _plan(grid, limit, decode, prefill)
        with tqdm(total=len(plan), desc="ampd profile", unit="probe", disable=not show_progress) as bar:
            for kind, probe, record in plan:
                bar.set_postfix_str(kind)
                point = await probe()
                if record:
                    getattr(points, kind).extend(point if isinstance(point, list) else [point])
                bar.update()
    return points, {"decode_engine": decode_print, "prefill_engine": prefill_print}


def _plan(grid: ProfileGrid, limit: int, decode: ProbedEngine, prefill: ProbedEngine | None) -> list:
    """``(kind, probe, record)`` in run order: warm-ups (not recorded) first, then each
    grid point ``repeats`` times, repeats of a point apart so a slow spell of the
    machine does not hit all of them."""
    def pre(h: int, n: int):
        return lambda: measure_prefill(decode, h, n)

    def dec(b: int, p: int):
        return lambda: measure_decode(decode, b, p, grid.decode_output_tokens)

    def kv(t: int):
        return lambda: measure_kv(prefill, decode, t)

    prefill_grid = [(h, n) for h in grid.hist_tokens for n in grid.new_tokens if h + n + 1 <= limit]
    decode_grid = [(b, p) for b in grid.batch_sizes for p in grid.decode_prompt_tokens
                   if p + grid.decode_output_tokens <= limit]
    kv_grid = [t for t in grid.kv_tokens if t + 1 <= limit] if prefill else []
    if not prefill_grid or not decode_grid:
        raise InputError(f"profile grid: nothing fits the engine's max_model_len {limit}")
    plan = [("prefill", pre(*prefill_grid[-1]), False) for _ in range(grid.warmup)]
    plan += [("decode", dec(*decode_grid[0]), False) for _ in range(grid.warmup)]
    plan += [("kv", kv(kv_grid[0]), False) for _ in range(grid.warmup if kv_grid else 0)]
    for _ in range(grid.repeats):
        plan += [("prefill", pre(h, n), True) for h, n in prefill_grid]
        plan += [("decode", dec(b, p), True) for b, p in decode_grid]
        plan += [("kv", kv(t), True) for t in kv_grid]
        plan += [("overhead", lambda: measure_overhead(decode), True) for _ in range(grid.overhead_probes)]
    mixed_prompt = min(grid.decode_prompt_tokens)
    mixed_new = min(grid.mixed_new_tokens, limit - 1)
    mixed_output = grid.decode_output_tokens
    if mixed_prompt + mixed_output <= limit:
        # A known budget needs one probe (chunks or a pause?); an unknown one is searched for.
        mixed = search_chunk_budget if grid.chunk_tokens is None else measure_mixed
        plan.append(("mixed", lambda: mixed(decode, grid.mixed_batch_size, mixed_prompt, mixed_output, mixed_new,
                                            limit - mixed_prompt), True))
    return plan


def fit(points: Measurements, seed: int, known_chunk_tokens: int | None = None) -> dict[str, Any]:
    """Fits of every function measured, with their reports and the engine's batching
    (``batching``; ``known_chunk_tokens``: the grid's ``chunk_tokens``).

    Returns:
        ``{"prefill": FitResult, "decode": FitResult, "kv": FitResult | None,
        "kv_bytes_per_token": int | None, "batching": dict, "request_overhead_s":
        float | None}`` (the median serving path of the overhead probes, at
        least 0; None without them).

    Raises:
        InputError: too few points to fit a function.
    """
    rng = np.random.default_rng(seed)
    prefill = fit_prefill_points([(p.hist_tokens, p.new_tokens, p.time_s) for p in points.prefill], rng)
    decode = fit_decode_points([(b, ctx, t) for (b, _), (ctx, t) in decode_medians(points.decode).items()], rng)
    kv = fit_kv_points([(p.bytes, 0, p.time_s) for p in points.kv], rng) if points.kv else None
    bytes_per_token = round(statistics.median(p.bytes / p.tokens for p in points.kv)) if points.kv else None
    # A median below 0 (the client's clock finer than the path) is no path: 0.
    overhead_s = max(0.0, statistics.median(p.overhead_s for p in points.overhead)) if points.overhead else None
    return {"prefill": prefill, "decode": decode, "kv": kv, "kv_bytes_per_token": bytes_per_token,
            "batching": batching(points.mixed, known_chunk_tokens), "request_overhead_s": overhead_s}


def decode_medians(points: list[DecodePoint]) -> dict[tuple[int, int], tuple[int, float]]:
    """``(context_tokens, step_s)`` per grid point ``(batch_size, prompt_tokens)``: the
    median step over its repeats, at the context they share (the grid point and the
    output length fix it)."""
    groups: dict[tuple[int, int], list[DecodePoint]] = {}
    for p in points:
        groups.setdefault((p.batch_size, p.prompt_tokens), []).append(p)
    return {key: (ps[0].context_tokens, statistics.median(p.step_s for p in ps))
            for key, ps in sorted(groups.items())}


def batching(mixed: list[MixedPoint], known_chunk_tokens: int | None = None) -> dict[str, Any]:
    """How the engine mixes a local prefill with decode steps, from the mixed probes
    (``search_chunk_budget``, or one ``measure_mixed`` when the budget is known):
    ``chunked`` when a prefill spread over several steps, with the budget found, or
    ``known_chunk_tokens`` (``chunk_tokens_from`` says which); ``alternate`` (the batch
    pauses for the whole prefill) when even the largest took one step; ``unmeasured``
    without probes."""
    if not mixed:
        return {"mode": "unmeasured"}
    seen = {"largest_probe_tokens": mixed[0].new_tokens, "num_probes": len(mixed)}
    if all(p.num_prefill_steps <= 1 for p in mixed):
        return {"mode": "alternate", **seen}
    if known_chunk_tokens is not None:
        return {"mode": "chunked", "chunk_tokens": known_chunk_tokens, "chunk_tokens_from": "engine configuration",
                **seen}
    return {"mode": "chunked", "chunk_tokens": chunk_budget_tokens(mixed), "chunk_tokens_from": "search", **seen}


def run(decode_url: str, prefill_url: str | None, grid: ProfileGrid, seed: int,
        show_progress: bool = True) -> tuple[Measurements, dict[str, Any], dict[str, Any]]:
    """``measure`` then ``fit``: ``(points, fingerprints, fits)``."""
    points, fingerprints = asyncio.run(measure(decode_url, prefill_url, grid, seed, show_progress))
    return points, fingerprints, fit(points, seed, grid.chunk_tokens)
