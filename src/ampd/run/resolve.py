"""A run's configuration resolved into what every consumer of it needs, the
simulator (``ampd.run.simulate``), the planner's adapter, ``ampd up``, the
coordinator and the mock engines alike: the performance model, the SLO
thresholds, the policies' knobs and batching, the workload's sessions and
arrival rate, and the steady-state measurement plan, every number from the
configuration. It never loads the simulator, so serving does not either
(``tests/test_layers.py``).

A run is a steady-state measurement unless ``workload.num_sessions`` is set
(AMPD.md section 6; ``ampd.measure``): sessions arrive for a warm-up, a
measurement window and a drain, only those arriving inside the window are
measured, and the run carries a stability verdict. With ``num_sessions`` it runs
exactly that many sessions and its verdict is ``transient``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ampd.config import AUTO_DEPLOYMENT, RunConfig
from ampd.core.deployment import Deployment, Role, WorkerSpec
from ampd.core.engine_kinds import READS_HISTORY
from ampd.core.errors import InputError
from ampd.core.session import Session
from ampd.measure import MeasurePlan, UnloadedLifetimes, measure_plan, slo_lifetime_s
from ampd.perf import build_perf_model, load_perf_model
from ampd.perf.interface import PerfModel
from ampd.perf.resolve import resolve_gpu, resolve_model
from ampd.perf.topology import default_topology
from ampd.policy.batching import Batching
from ampd.policy.routing import SloThresholds
from ampd.policy.systems import Knobs, System, decode_batching, get_system
from ampd.run.slo_rule import derive_slo, reference_tp
from ampd.workload import (
    arrival_rate_per_s, builtin_trace, cycled, load_any, poisson_arrivals, poisson_until, repeated, sampled,
    synthetic_sessions, with_arrivals)

# [our choice] Sessions of a synthetic workload that stand for it where a run needs its
# statistics (SLO thresholds, unloaded lifetime): enough that the means move by < 1 %
# between seeds; a trace stands for itself (all its sessions, once).
SAMPLE_SESSIONS = 1000

# A synthetic workload's arrival rate when none is configured (sessions/s); a trace's
# default is its own rate (``rate_for``).
DEFAULT_RATE_PER_S = 1.0


def perf_model_for(config: RunConfig) -> PerfModel:
    """The performance model of the run: ``cluster.perf_model``'s file when set, else
    the model and GPU ``cluster.model`` and ``cluster.gpu`` name (catalog names or files,
    ``ampd.perf.resolve``); either way with the configured servers
    and links (a file's measured KV link, when it has one, still times transfers:
    ``AlphaBetaPerfModel.kv_transfer_s``). A file's measured remote path is dropped for
    engines whose prefill engine does not read history (``serve.engine`` ``vllm``): it
    times requests they never make.

    Raises:
        InputError: an unknown model or GPU, a bad model or GPU file, or a perf model file
            that cannot be read.
    """
    cluster = config.cluster
    loaded = load_perf_model(cluster.perf_model) if cluster.perf_model else None
    device = loaded.gpu if loaded else resolve_gpu(cluster.gpu)
    topology = default_topology(device)
    topology = dataclasses.replace(topology, gpus_per_server=cluster.gpus_per_server,
                                   network_gb_per_s=cluster.network_gb_per_s,
                                   nvlink_gb_per_s=cluster.nvlink_gb_per_s or topology.nvlink_gb_per_s)
    if loaded is not None:
        measured = loaded.measured
        if not READS_HISTORY[config.serve.engine]:
            measured = dataclasses.replace(measured, remote_path=None)
        return dataclasses.replace(loaded, topology=topology, measured=measured)
    return build_perf_model(resolve_model(cluster.model), device, topology)


def require_tp(perf: PerfModel, tp: int, where: str) -> None:
    """Refuse a replica of ``tp`` GPUs that ``perf`` has no cost functions for (a
    profile holds only the TP degrees it measured).

    Raises:
        InputError: naming ``where``, the TP and the TPs the model has.
    """
    if tp not in perf.tps:
        raise InputError(f"{where}: TP={tp} has no cost functions in the performance model; it has "
                         f"TP={', '.join(map(str, perf.tps))} (profile the engine at TP={tp}, or use those)")


def batching_for(config: RunConfig, perf: PerfModel) -> Batching:
    """How the run's decode workers batch local prefills: ``cluster.decode_batching``
    resolved for the system and ``perf`` (``ampd.policy.systems.decode_batching``),
    with ``policy.chunk_tokens`` per chunked step unless the perf model measured
    the engine's own budget."""
    return decode_batching(get_system(config.system), config.cluster.decode_batching, config.policy.chunk_tokens,
                           perf)


def knobs_for(config: RunConfig, perf: PerfModel) -> Knobs:
    """The system's constants (``PolicyConfig.knobs``) with the decode engines'
    batching (``batching_for``), so the router estimates a local prefill as the
    decode workers run it."""
    return dataclasses.replace(config.policy.knobs(), batching=batching_for(config, perf))


def _rngs(config: RunConfig) -> tuple[np.random.Generator, np.random.Generator]:
    """Independent generators for session contents and for arrival times, both
    from ``workload.seed``: the same sessions at every rate and run length."""
    content, arrivals = np.random.SeedSequence(config.workload.seed).spawn(2)
    return np.random.default_rng(content), np.random.default_rng(arrivals)


def _trace(config: RunConfig) -> tuple[Session, ...]:
    """The configured trace's sessions (read once per file version: a sweep asks
    for them at every point)."""
    w = config.workload
    if w.trace.startswith("builtin:"):
        return _load(w.trace, None, 0.0)
    try:
        mtime_ns = Path(w.trace).stat().st_mtime_ns
    except OSError:
        mtime_ns = 0  # load_any names the missing file
    return _load(w.trace, w.trace_format, mtime_ns)


@functools.lru_cache(maxsize=8)
def _load(trace: str, trace_format: str | None, mtime_ns: float) -> tuple[Session, ...]:
    if trace.startswith("builtin:"):
        return tuple(builtin_trace(trace.removeprefix("builtin:")))
    return tuple(load_any(trace, trace_format))


def session_stream(config: RunConfig) -> Iterator[Session]:
    """The workload's sessions in arrival order, without arrival times: a synthetic
    workload's endless stream; a trace's sessions in their recorded order (a run
    of ``num_sessions``, or recorded arrivals: the trace repeated,
    ``ampd.workload.cycled``), else drawn at random from it
    (``ampd.workload.sampled``: a steady state of the trace's mix).

    Raises:
        InputError: an unknown workload, or a trace that cannot be read (named).
    """
    w = config.workload
    if w.name is not None:
        return synthetic_sessions(w.name, _rngs(config)[0])
    if w.num_sessions is not None or w.arrival_process == "recorded":
        return cycled(_trace(config))
    return sampled(_trace(config), _rngs(config)[0])


def sample_sessions(config: RunConfig) -> list[Session]:
    """The sessions that stand for the workload (``SAMPLE_SESSIONS``)."""
    if config.workload.name is not None:
        return list(itertools.islice(session_stream(config), SAMPLE_SESSIONS))
    return list(_trace(config))


def measure_for(config: RunConfig, perf: PerfModel | None = None,
                slo: SloThresholds | None = None) -> MeasurePlan | None:
    """The run's phases (``ampd.measure.measure_plan``; fields of ``config.measure``
    that are set win), or None for a run of ``workload.num_sessions`` sessions.
    ``perf`` and ``slo``: the run's (``perf_model_for``, ``slo_for``) when the caller
    has them already."""
    if config.workload.num_sessions is not None:
        return None
    perf = perf or perf_model_for(config)
    sample = sample_sessions(config)
    unloaded = UnloadedLifetimes(perf, reference_tp(perf))
    slo = slo or slo_for(config, perf)
    m = config.measure
    return measure_plan(unloaded, unloaded.mean_s(sample), slo_lifetime_s(sample, slo.ttft_s, slo.itl_s),
                        rate_for(config), m.warmup_s, m.window_s, m.drain_s)


def rate_for(config: RunConfig) -> float:
    """The run's arrival rate, sessions/s: ``workload.rate_per_s`` when set; else
    a trace's own rate (``ampd.workload.arrival_rate_per_s``: ``(n - 1) / span``),
    or ``DEFAULT_RATE_PER_S`` for a synthetic workload.

    Raises:
        InputError: no rate set and a trace whose sessions do not arrive at
            different times (it has no rate of its own).
    """
    w = config.workload
    if w.rate_per_s is not None:
        return w.rate_per_s
    if w.trace is None:
        return DEFAULT_RATE_PER_S
    return _trace_rate_per_s(config)


def _trace_rate_per_s(config: RunConfig) -> float:
    try:
        return arrival_rate_per_s(_trace(config))
    except InputError:
        raise InputError(f"workload.trace {config.workload.trace}: its sessions do not arrive at different times, "
                         f"so it has no rate of its own; give arrivals = 'poisson' and a rate_per_s "
                         f"(--arrivals poisson --rate R)") from None


def arrivals_scale(config: RunConfig) -> float | None:
    """What recorded arrival times are divided by: the configured rate over the
    trace's own (1 when no rate is set: the times exactly as recorded); None for
    Poisson arrivals.

    Raises:
        InputError: as ``rate_for``.
    """
    if config.workload.arrival_process != "recorded":
        return None
    return rate_for(config) / _trace_rate_per_s(config)


def _recorded_times(config: RunConfig) -> Iterator[float]:
    """The trace's arrival times divided by ``arrivals_scale``, repeated back to
    back for ever (``ampd.workload.repeated``).

    Raises:
        InputError: as ``rate_for``.
    """
    scale = arrivals_scale(config)
    return repeated([s.arrival_s / scale for s in _trace(config)])


def sessions_for(config: RunConfig, plan: MeasurePlan | None = None) -> list[Session]:
    """The run's sessions with their arrival times: ``workload.num_sessions`` of
    them, or as many as arrive before the ``plan``'s horizon (``measure_for``
    when not given).

    Raises:
        InputError: an unknown workload, an unreadable trace, or recorded arrivals
            that all fall at one time.
    """
    w = config.workload
    n = w.num_sessions
    if n is not None and w.trace is not None and n > len(_trace(config)):
        raise InputError(f"workload.num_sessions = {n}, but trace {w.trace} holds {len(_trace(config))} sessions; "
                         f"leave num_sessions unset for a steady-state run, which repeats the trace")
    horizon_s = (plan or measure_for(config)).horizon_s if n is None else None
    if w.arrival_process == "recorded":
        pattern = _recorded_times(config)
        times = (list(itertools.islice(pattern, n)) if n is not None
                 else list(itertools.takewhile(lambda t: t < horizon_s, pattern)))
    elif n is None:
        times = poisson_until(horizon_s, rate_for(config), _rngs(config)[1])
    else:
        times = poisson_arrivals(n, rate_for(config), _rngs(config)[1])
    return with_arrivals(session_stream(config), times)


def slo_for(config: RunConfig, perf: PerfModel) -> SloThresholds:
    """The configured thresholds, each missing one derived by ``derive_slo`` from
    the workload's ``sample_sessions``."""
    if config.slo.ttft_s and config.slo.itl_s:
        return SloThresholds(config.slo.ttft_s, config.slo.itl_s)
    derived = derive_slo(perf, sample_sessions(config))
    return SloThresholds(config.slo.ttft_s or derived.ttft_s, config.slo.itl_s or derived.itl_s)


def _check_roles(system: System, specs: tuple[WorkerSpec, ...], deployment: str) -> None:
    has_prefill = any(s.role is Role.PREFILL for s in specs)
    if system.needs_prefill_workers and not has_prefill:
        raise InputError(f"system {system.name!r} needs prefill workers; deployment {deployment!r} has none")
    if system.colocated and has_prefill:
        raise InputError(f"system {system.name!r} runs colocated replicas only: give decode replicas alone, "
                         f"e.g. 'D:<TP=4,DP=2>', not {deployment!r}")


def check_runnable(config: RunConfig) -> tuple[WorkerSpec, ...]:
    """The deployment's workers, once everything a run needs before it starts is
    checked: a resolved deployment that packs into the cluster, the roles the
    system needs, weights that fit every replica, and (a trace) every session's
    KV within the largest decode replica, so a sweep fails before its first point
    rather than in the middle.

    Raises:
        InputError: naming what does not fit, or a TP the performance model has no
            cost functions for (``require_tp``).
    """
    system = get_system(config.system)
    if config.cluster.deployment == AUTO_DEPLOYMENT:
        raise InputError("cluster.deployment 'auto' must be resolved before simulating "
                         "(ampd.run.planning.resolve_deployment; the CLI does it)")
    specs = Deployment.parse(config.cluster.deployment).workers(config.cluster.num_gpus, config.cluster.gpus_per_server)
    _check_roles(system, specs, config.cluster.deployment)
    perf = perf_model_for(config)
    for spec in specs:
        require_tp(perf, spec.tp, f"cluster.deployment {config.cluster.deployment!r}")
        if perf.kv_capacity_tokens(spec.tp) <= 0:
            raise InputError(f"worker {spec.worker_id} ({spec.role.value}, TP={spec.tp}): the model's weights do not "
                             f"fit in {spec.tp} GPU(s) with room for KV cache")
    if config.workload.trace is not None:
        largest = max(perf.kv_capacity_tokens(s.tp) for s in specs if s.role is Role.DECODE)
        too_big = next((s for s in _trace(config) if s.total_tokens > largest), None)
        if too_big is not None:
            raise InputError(f"workload.trace {config.workload.trace}: session {too_big.session_id}'s KV reaches "
                             f"{too_big.total_tokens} tokens, the largest decode replica holds {largest}")
    return specs
