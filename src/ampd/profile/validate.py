"""``ampd validate``: profile a configuration's engines (or load a profile), measure
the serving stack in front of them on a calibration trace (``calibrate_stack``),
simulate its trace with the profile, replay the same trace against the real cluster,
and compare (``ampd.profile.sim_vs_real``).

Each real repeat starts the cluster afresh (cold caches, as the simulator starts) and
draws fresh prompt ids (``seed + repeat``), so no repeat hits a prefix an earlier one
left in an engine; with NIXL engines each pair makes its first contact (one KV
transfer each way) before the run, since the simulator has no handshakes. Two or more
repeats give the repeat-to-repeat spread, the yardstick
for the sim-vs-real errors: a simulator cannot be asked to agree with a cluster more
closely than the cluster agrees with itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ampd.config import EngineWorker, RunConfig, with_perf_model
from ampd.core.errors import InputError
from ampd.core.session import Round, Session
from ampd.run.resolve import perf_model_for, sessions_for
from ampd.run.simulate import RunOutput, simulate
from ampd.profile.cpu_use import cpu_seconds, cpu_share
from ampd.profile.engine_side import coordinator_phases, engine_side, snapshot_engines
from ampd.profile.profile_file import FORMAT as PROFILE_FORMAT
from ampd.profile.profile_file import profile_document, write
from ampd.profile.run import ProfileGrid, fit, measure
from ampd.profile.sim_vs_real import compare
from ampd.profile.stack_probe import CALIBRATION_SEED_OFFSET, CALIBRATION_SESSIONS, MEASURED_BY_STACK, stack_from_phases
from ampd.core.clock import ScaledClock
from ampd.engines.nixl_warmup import warm_nixl_pair
from ampd.cluster.replay import ReplayResult, replay
from ampd.cluster.up import LocalCluster
from ampd.run.slo_rule import derive_slo

# [our choice] A handshake has taken a minute on 2 loaded cores (docs/SERVING.md,
# "First contact"); ten leaves room for both directions and a slower machine.
_FIRST_CONTACT_TIMEOUT_S = 600.0
# Engine kinds whose prefill engine hands KV to its decode engine over a connector the
# profiler can time (T_kv); ``vllm`` (ExampleConnector, through files) is not timed.
_KV_TIMED_ENGINES = ("mock", "vllm-nixl")

logger = logging.getLogger(__name__)


@dataclass
class Validation:
    """One validation: the simulated run, the real runs, and their comparisons.

    Attributes:
        profile_path: the profile the simulator ran on.
        sim: the simulated run of ``sessions``.
        runs: each real repeat's replay.
        figures: ``compare(real, sim)`` per repeat.
        spread: ``compare`` of the second real repeat against the first (None with
            one repeat).
        engine_side: ``ampd.profile.engine_side.engine_side`` per repeat: the
            engines' own counters against the simulator and the client, with
            ``coordinator_phases`` (``engine_side.coordinator_phases``): the
            coordinators' TTFT phases, where the rest of the gap lies; and
            ``cpu_per_wall_s`` (``ampd.profile.cpu_use.cpu_share``): each part's
            CPU seconds per wall second of the run (``client``: this process),
            beside ``cpu_count``, the cores this process may run on.
        clipped_rounds: rounds left out of the trace because their context would
            exceed the engines' ``max_model_len``.
    """

    profile_path: Path
    sim: RunOutput
    runs: list[ReplayResult]
    figures: list[dict[str, Any]]
    spread: dict[str, Any] | None
    engine_side: list[dict[str, Any]]
    clipped_rounds: int


def clip_to_context(sessions: list[Session], max_context_tokens: int) -> tuple[list[Session], int]:
    """Each session up to its last round whose context (every earlier input and
    output plus its own) fits ``max_context_tokens``; sessions with no such round are
    left out. Returns the sessions and the number of rounds dropped."""
    kept, dropped = [], 0
    for session in sessions:
        total, rounds = 0, []
        for r in session.rounds:
            total += r.input_tokens + r.output_tokens
            if total > max_context_tokens:
                break
            rounds.append(r)
        dropped += len(session.rounds) - len(rounds)
        if rounds:
            last = rounds[-1]
            rounds[-1] = Round(last.input_tokens, last.output_tokens, 0.0)  # no tool call after the last round
            kept.append(dataclasses.replace(session, rounds=tuple(rounds)))
    return kept, dropped


def engine_urls(config: RunConfig) -> tuple[str | None, str]:
    """``(prefill_url, decode_url)`` of a started cluster's first prefill and decode
    engines; the prefill URL is None where the profiler cannot time its KV transfers."""
    workers = config.serve.workers
    decode = next(w.url for w in workers if w.role == "decode")
    prefill = next((w.url for w in workers if w.role == "prefill"), None)
    return (prefill if config.serve.engine in _KV_TIMED_ENGINES else None), decode


def profile_config(config: RunConfig, out_dir: Path, grid: ProfileGrid, progress: bool) -> Path:
    """Start the configuration's cluster, profile its engines, write
    ``out_dir/profile.json``; the path. The profile names the model and GPU of
    ``config``'s perf model file when it has one (profiled again), else the
    configuration's catalog entries or spec files.

    Raises:
        InputError: the cluster did not start (named part and log), or the named
            perf model file or model/GPU cannot be read (named).
        ProbeError: an engine failed a probe.
    """
    # A configuration that names a perf model file is profiled again under the file's model and GPU.
    named = perf_model_for(config)
    model, gpu = named.model, named.gpu
    # The engines ampd starts run the configuration's token budget (vllm_launch, the
    # mock's decode worker): known, so not searched for.
    grid = dataclasses.replace(grid, chunk_tokens=config.policy.chunk_tokens)
    with LocalCluster(config, out_dir / "logs-profile") as cluster:
        prefill_url, decode_url = engine_urls(cluster.config)
        points, prints = asyncio.run(measure(decode_url, prefill_url, grid, config.seed, progress))
    tp = next(w.tp for w in cluster.config.serve.workers if w.role == "decode")
    return write(profile_document(points, prints, fit(points, config.seed, grid.chunk_tokens), model, gpu, tp, grid, config.seed),
                 out_dir / "profile.json")


def validate(config: RunConfig, out_dir: Path, repeats: int, vocab_size: int, timeout_s: float,
             max_context_tokens: int, grid: ProfileGrid, progress: bool = True,
             profile_now: bool = False, measure_stack: bool = True) -> Validation:
    """Profile (unless ``config`` names a perf model and not ``profile_now``), measure
    the serving stack (unless not ``measure_stack``: then the file's, if it has one),
    simulate, replay ``repeats`` times, compare (see the module docstring).

    Args:
        vocab_size: prompt ids are drawn below it (the engines' vocabulary).
        timeout_s: a round with no reply for this long (wall seconds) fails.
        max_context_tokens: the engines' ``max_model_len`` (rounds beyond it are left
            out of the trace, on both sides).
        profile_now: profile the engines even where ``config`` names a perf model
            (whose model and GPU specs the new profile keeps): a profile taken at
            another time times another machine where the host's speed drifts
            (docs/PROFILING.md, "Sim vs real").
        measure_stack: serve a calibration trace first and time the simulator with
            the coordinators' and the client's share it measures (``calibrate_stack``).

    Raises:
        InputError: ``repeats`` < 1, a trace with nothing that fits, or any error of
            the cluster, the profile or the simulation (named).
        ProbeError: an engine failed a probe, or the calibration served no remote round.
    """
    if repeats < 1:
        raise InputError(f"validate: repeats must be >= 1, got {repeats}")
    hardware = config
    if config.cluster.perf_model is None or profile_now:
        config = with_perf_model(config, str(profile_config(config, out_dir, grid, progress)))
    sessions, clipped = clip_to_context(sessions_for(config), max_context_tokens)
    if not sessions:
        raise InputError(f"validate: no session of the workload fits max_model_len {max_context_tokens}")
    if measure_stack:
        config = with_perf_model(config, str(calibrate_stack(config, hardware, out_dir, vocab_size, timeout_s,
                                                             max_context_tokens, progress)))
    sim = simulate(config, sessions)
    replays = [_replay(config, hardware, sessions, sim, out_dir / f"logs-real-{i}", vocab_size, timeout_s,
                       config.seed + i, progress) for i in range(repeats)]
    runs = [run for run, _ in replays]
    figures = [compare(run.sessions, sim.result.sessions, run.summary, sim.summary) for run in runs]
    spread = compare(runs[1].sessions, runs[0].sessions, runs[1].summary, runs[0].summary) if repeats > 1 else None
    return Validation(Path(config.cluster.perf_model), sim, runs, figures, spread, [side for _, side in replays],
                      clipped)


def history_read_min_tokens(config: RunConfig) -> int | None:
    """The shortest history the configuration's prefill engines read from the decode
    engine rather than recompute (``vllm-nixl``: its ``kv_recompute_threshold``; mock
    engines read any); None when they recompute every history (``vllm``)."""
    engine = config.serve.engine
    if engine == "vllm-nixl":
        return config.serve.nixl_kv_recompute_threshold_tokens
    return 0 if engine == "mock" else None


def _first_contact(config: RunConfig, workers: list[EngineWorker], model: str, vocab_size: int) -> None:
    """Every NIXL prefill-decode pair's handshakes, before the run (the simulator has
    none; ``ampd.engines.nixl_warmup``). A pair that does not make them within
    ``_FIRST_CONTACT_TIMEOUT_S`` is logged, and its first rounds meet them."""
    # Long enough to be read rather than recomputed: past the read threshold, whole blocks.
    tokens = max(96, 2 * config.serve.nixl_kv_recompute_threshold_tokens)
    prompt = [3 + i % (vocab_size - 3) for i in range(tokens)]  # ids 0-2 are special in most vocabularies
    for p in (w for w in workers if w.role == "prefill"):
        for d in (w for w in workers if w.role == "decode"):
            try:
                asyncio.run(warm_nixl_pair(p.url, d.url, model, prompt, _FIRST_CONTACT_TIMEOUT_S))
            except httpx.HTTPError as exc:
                logger.warning("validate: NIXL first contact %s -> %s failed (%r); its first rounds meet it",
                               p.url, d.url, exc)


@contextmanager
def _serving(config: RunConfig, hardware: RunConfig, log_dir: Path, vocab_size: int) -> Iterator[LocalCluster]:
    """``config``'s cluster started (its coordinators route by ``config``'s profile; mock
    engines are timed as ``hardware`` says, what was profiled), NIXL pairs past their
    first contact."""
    with LocalCluster(config, log_dir, engines_timed_by=hardware) as cluster:
        if config.serve.engine == "vllm-nixl":
            _first_contact(config, cluster.config.serve.workers, _model(config), vocab_size)
        yield cluster


def _model(config: RunConfig) -> str:
    return config.serve.served_model or config.cluster.model


def calibrate_stack(config: RunConfig, hardware: RunConfig, out_dir: Path, vocab_size: int, timeout_s: float,
                    max_context_tokens: int, progress: bool) -> Path:
    """Measure the serving stack (``ampd.profile.stack_probe``) on ``config``'s cluster,
    started afresh, with a calibration trace: ``CALIBRATION_SESSIONS`` sessions of the
    workload drawn with seed ``seed + CALIBRATION_SEED_OFFSET``; write
    ``out_dir/profile.json``: ``config``'s perf model file (a profile or a perf model)
    with the measured ``serving_stack`` (and, in a profile, its report in
    ``fit_report.serving_stack``); the path.

    Raises:
        InputError: the cluster did not start, or no calibration session fits
            ``max_context_tokens``.
        ProbeError: the calibration served no remote round on a cluster with prefill
            engines.
    """
    seed = config.seed + CALIBRATION_SEED_OFFSET
    drawn = sessions_for(config.model_copy(update={"seed": seed}))[:CALIBRATION_SESSIONS]
    sessions, _ = clip_to_context(drawn, max_context_tokens)
    if not sessions:
        raise InputError(f"validate: no calibration session fits max_model_len {max_context_tokens}")
    slo = derive_slo(perf_model_for(config), sessions)  # the replay's summary needs thresholds; not read
    with _serving(config, hardware, out_dir / "logs-stack", vocab_size) as cluster:
        before = asyncio.run(snapshot_engines(cluster.urls))
        run = asyncio.run(replay(cluster.urls[0], sessions, model=_model(config),
                                 clock=ScaledClock(config.serve.time_scale), ttft_slo_s=slo.ttft_s,
                                 itl_slo_s=slo.itl_s, vocab_size=vocab_size, seed=seed, timeout_s=timeout_s,
                                 progress=progress))
        phases = coordinator_phases(before, asyncio.run(snapshot_engines(cluster.urls)))
        prefill_engines = any(w.role == "prefill" for w in cluster.config.serve.workers)
    stack = stack_from_phases(phases, run.sessions, prefill_engines)
    source = Path(config.cluster.perf_model)
    document = json.loads(source.read_text())
    report = {"sessions": len(sessions), "seed": seed, "failed_sessions": len(run.failed), "coordinator_phases": phases,
              "measured_by": MEASURED_BY_STACK}
    if document.get("format") == PROFILE_FORMAT:
        document["perf_model"]["serving_stack"] = stack._asdict()
        document["fit_report"]["serving_stack"] = report
    else:
        document["serving_stack"] = stack._asdict()
    return write(document, out_dir / "profile.json")


def _replay(config: RunConfig, hardware: RunConfig, sessions: list[Session], sim: RunOutput, log_dir: Path,
            vocab_size: int, timeout_s: float, seed: int, progress: bool) -> tuple[ReplayResult, dict[str, Any]]:
    """One real run and its engine-side figures (the cluster as ``_serving`` starts it)."""
    with _serving(config, hardware, log_dir, vocab_size) as cluster:
        workers = cluster.config.serve.workers
        before = asyncio.run(snapshot_engines([w.url for w in workers]))
        coordinators_before = asyncio.run(snapshot_engines(cluster.urls))
        cpu_before, started_s = _cpu_seconds(cluster), time.monotonic()
        run = asyncio.run(replay(cluster.urls[0], sessions, model=_model(config),
                                 clock=ScaledClock(config.serve.time_scale), ttft_slo_s=sim.slo.ttft_s,
                                 itl_slo_s=sim.slo.itl_s, scope=config.slo.scope, vocab_size=vocab_size, seed=seed,
                                 timeout_s=timeout_s, progress=progress, plan=sim.plan))
        cpu = cpu_share(cpu_before, _cpu_seconds(cluster), time.monotonic() - started_s)
        after = asyncio.run(snapshot_engines([w.url for w in workers]))
        phases = coordinator_phases(coordinators_before, asyncio.run(snapshot_engines(cluster.urls)))
    prefill_tp = next((w.tp for w in workers if w.role == "prefill"), 1)
    side = engine_side([w.role for w in workers], before, after, run.sessions, sim.result.sessions,
                       perf_model_for(config), prefill_tp, history_read_min_tokens(config))
    return run, {**side, "coordinator_phases": phases, "cpu_per_wall_s": cpu, "cpu_count": len(os.sched_getaffinity(0))}


def _cpu_seconds(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds so far of each part of ``cluster`` (its processes and theirs) and
    of this process, the client (``ampd.profile.cpu_use``)."""
    return {**cpu_seconds({child.name: child.process.pid for child in cluster.children}),
            **cpu_seconds({"client": os.getpid()}, tree=False)}

