"""One simulation run from a RunConfig, and sweeps of runs over systems, workloads
and rates. The glue between configuration, workload, performance model, policies
and simulator; every number it uses comes from the configuration."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import numpy as np

from ampd.config import RunConfig
from ampd.core.deployment import Deployment, Role, WorkerSpec
from ampd.core.errors import InputError
from ampd.core.session import Session
from ampd.metrics.summary import RunSummary, summarize
from ampd.perf import build_perf_model, catalog
from ampd.perf.interface import PerfModel
from ampd.perf.topology import default_topology
from ampd.policy.routing import SloThresholds
from ampd.policy.systems import Knobs, System, get_system
from ampd.sim.cluster import SimCluster, SimResult, WorkerOptions
from ampd.sim.decode_worker import Batching
from ampd.slo_rule import derive_slo
from ampd.workload import builtin_trace, generate, load_any, rescale_rate, take, with_poisson_arrivals


SYNTHETIC_SESSIONS = 200  # sessions of a synthetic workload when workload.num_sessions is not set


@dataclass
class RunOutput:
    """A finished run: its configuration, thresholds, summary and raw result."""

    config: RunConfig
    slo: SloThresholds
    summary: RunSummary
    result: SimResult


def perf_model_for(config: RunConfig) -> PerfModel:
    """The performance model of the configured model, GPU and network."""
    cluster = config.cluster
    topology = default_topology(catalog.gpu(cluster.gpu))
    topology = dataclasses.replace(topology, gpus_per_server=cluster.gpus_per_server,
                                   network_gb_per_s=cluster.network_gb_per_s,
                                   nvlink_gb_per_s=cluster.nvlink_gb_per_s or topology.nvlink_gb_per_s)
    return build_perf_model(cluster.model, cluster.gpu, topology)


def sessions_for(config: RunConfig) -> list[Session]:
    """The configured sessions: a synthetic workload, or a trace's first
    ``num_sessions`` sessions with recorded (rescaled) or Poisson arrivals."""
    w = config.workload
    rng = np.random.default_rng(w.seed)
    if w.name is not None:
        return generate(w.name, w.num_sessions or SYNTHETIC_SESSIONS, w.rate_per_s, rng)
    if w.trace.startswith("builtin:"):
        sessions = builtin_trace(w.trace.removeprefix("builtin:"))
    else:
        sessions = load_any(w.trace, w.trace_format)
    if w.num_sessions is not None:
        if w.num_sessions > len(sessions):
            raise InputError(f"workload.num_sessions = {w.num_sessions}, but trace {w.trace} holds "
                             f"{len(sessions)} sessions")
        sessions = take(sessions, w.num_sessions)
    if w.arrivals == "poisson" or len(sessions) < 2:
        return with_poisson_arrivals(sessions, w.rate_per_s, rng)
    return _at_rate(sessions, w.rate_per_s)


def _at_rate(sessions: list[Session], rate_per_s: float) -> list[Session]:
    start_s = sessions[0].arrival_s
    shifted = [dataclasses.replace(s, arrival_s=s.arrival_s - start_s) for s in sessions]
    span_s = shifted[-1].arrival_s
    if span_s <= 0:
        raise InputError("workload.trace: every session arrives at the same time; use arrivals = 'poisson'")
    return rescale_rate(shifted, rate_per_s * span_s / (len(shifted) - 1))


def slo_for(config: RunConfig, perf: PerfModel, sessions: list[Session]) -> SloThresholds:
    """The configured thresholds, each missing one derived by ``derive_slo``."""
    derived = derive_slo(perf, sessions)
    return SloThresholds(config.slo.ttft_s or derived.ttft_s, config.slo.itl_s or derived.itl_s)


def _check_roles(system: System, specs: tuple[WorkerSpec, ...], deployment: str) -> None:
    has_prefill = any(s.role is Role.PREFILL for s in specs)
    if system.needs_prefill_workers and not has_prefill:
        raise InputError(f"system {system.name!r} needs prefill workers; deployment {deployment!r} has none")
    if system.colocated and has_prefill:
        raise InputError(f"system {system.name!r} runs colocated replicas only: give decode replicas alone, "
                         f"e.g. 'D:<TP=4,DP=2>', not {deployment!r}")


def simulate(config: RunConfig, sessions: list[Session] | None = None) -> RunOutput:
    """Run ``config`` through the simulator.

    Raises:
        InputError: unknown system, model or GPU; an infeasible deployment; a
            system that needs prefill workers given none.
    """
    system = get_system(config.system)
    perf = perf_model_for(config)
    sessions = sessions if sessions is not None else sessions_for(config)
    slo = slo_for(config, perf, sessions)
    if config.cluster.deployment == "auto":
        raise InputError("cluster.deployment 'auto' must be resolved before simulating "
                         "(ampd.planning.resolve_deployment; the CLI does it)")
    specs = Deployment.parse(config.cluster.deployment).workers(config.cluster.num_gpus, config.cluster.gpus_per_server)
    _check_roles(system, specs, config.cluster.deployment)
    p = config.policy
    knobs = Knobs(p.alpha, p.beta, p.reorder_window)
    router = system.make_router(perf, slo, knobs, random.Random(config.seed))
    options = WorkerOptions(p.window_s, Batching(system.batching, p.chunk_tokens), system.kv_retention, p.pin_ttl_s)
    cluster = SimCluster(specs, perf, router, system.make_queue_policy(slo, knobs), options)
    result = cluster.run(sessions)
    return RunOutput(config, slo, summarize(result.sessions, slo.ttft_s, slo.itl_s, config.slo.scope), result)
