"""A coordinator from a ``RunConfig``: the same system, performance model and
SLO thresholds a simulation of that configuration uses."""

from __future__ import annotations

import dataclasses
import os
import random
import socket
import zlib

from fastapi import FastAPI

from ampd.config import RunConfig
from ampd.core.deployment import Role, WorkerSpec
from ampd.core.errors import InputError
from ampd.run.resolve import knobs_for, perf_model_for, require_tp, slo_for
from ampd.metrics.slo import SloScope
from ampd.policy.routing import SloThresholds
from ampd.policy.systems import get_system
from ampd.serve.api.app import create_app
from ampd.serve.api.auth import AccessPolicy
from ampd.core.clock import ScaledClock
from ampd.serve.coordinator import Coordinator, CoordinatorOptions
from ampd.serve.replica.decision_log import DecisionLog
from ampd.serve.state.memory_store import MemoryStore
from ampd.serve.state.redis_store import RedisStore
from ampd.serve.state.store import StateStore, WorkerInfo

_ROLES = {"prefill": Role.PREFILL, "decode": Role.DECODE}


def engine_workers(config: RunConfig) -> list[WorkerInfo]:
    """``serve.workers`` as registry entries, ids in the order given.

    Raises:
        InputError: the list is empty, the system's roles do not match it, or a
            worker's TP has no cost functions in the performance model.
    """
    entries = config.serve.workers
    if not entries:
        raise InputError("serve.workers is empty: list the engine servers ([[serve.workers]] url, role, tp, "
                         "server), or let `ampd up` start them")
    workers = [WorkerInfo(WorkerSpec(i, _ROLES[w.role], w.tp, w.server), w.url.rstrip("/"), config.serve.engine)
               for i, w in enumerate(entries)]
    system = get_system(config.system)
    perf = perf_model_for(config)
    for w in workers:
        require_tp(perf, w.spec.tp, f"serve.workers[{w.spec.worker_id}] ({w.url})")
        if w.spec.role is Role.DECODE and perf.kv_capacity_tokens(w.spec.tp) <= 0:
            raise InputError(f"serve.workers[{w.spec.worker_id}] ({w.url}): {config.cluster.model} does not fit "
                             f"in {w.spec.tp} x {config.cluster.gpu} with room for KV cache; give it a larger tp")
    roles = {w.spec.role for w in workers}
    if Role.DECODE not in roles:
        raise InputError("serve.workers: at least one decode engine is needed (it holds the sessions' KV)")
    if system.needs_prefill_workers and Role.PREFILL not in roles:
        raise InputError(f"serve.workers: system {system.name!r} needs a prefill engine; none is listed")
    return workers


def serve_slo(config: RunConfig) -> SloThresholds:
    """The thresholds the router aims at: the configured ones, each missing one
    derived from the configured workload exactly as a simulation does."""
    return slo_for(config, perf_model_for(config))


def make_store(config: RunConfig) -> StateStore:
    """Redis when ``serve.redis_url`` is set, else the in-memory store."""
    window_s = config.policy.window_s
    return RedisStore(config.serve.redis_url, window_s) if config.serve.redis_url else MemoryStore(window_s)


def build_coordinator(config: RunConfig, replica_id: str = "") -> Coordinator:
    """A coordinator replica for ``config`` (its store not yet contacted).

    Raises:
        InputError: unknown system, model or GPU; bad worker list.
    """
    serve = config.serve
    replica_id = replica_id or serve.replica_id or f"{socket.gethostname()}:{os.getpid()}"
    system = get_system(config.system)
    perf = perf_model_for(config)
    slo = serve_slo(config)
    # A served engine's chunk budget is engine-wide (vLLM's max_num_batched_tokens): a
    # router estimates local prefills in that budget, not in chunks of its own.
    knobs = dataclasses.replace(knobs_for(config, perf), per_task_chunks=False)
    # Each replica draws its own visiting order (Algorithm 1 step 1), so replicas do not herd.
    rng = random.Random(config.seed * 1_000_003 + zlib.crc32(replica_id.encode()))
    options = CoordinatorOptions(replica_id, serve.served_model or config.cluster.model, serve.kv_timeout_s,
                                 serve.admission_timeout_s, serve.health_interval_s, serve.session_idle_ttl_s,
                                 serve.stream_idle_timeout_s, serve.kv_audit_interval_s,
                                 session_block_tokens=serve.session_block_tokens,
                                 history_read_min_tokens=serve.nixl_kv_recompute_threshold_tokens,
                                 itl_slack_threshold_s=slo.itl_s if config.slo.scope is SloScope.MEAN else None)
    return Coordinator(engine_workers(config), make_store(config), perf, system.make_router(perf, slo, knobs, rng),
                       system.make_queue_policy(slo, knobs), ScaledClock(serve.time_scale), options,
                       DecisionLog(serve.decisions_path or None))


def build_app(config: RunConfig, replica_id: str = "") -> FastAPI:
    """The HTTP API of a coordinator replica for ``config``: its keys (files and
    environment) loaded, its body limits set.

    Raises:
        InputError: as ``build_coordinator``; a key file that cannot be read or holds no key.
    """
    serve = config.serve
    access = AccessPolicy.load(serve.api_keys_file, serve.admin_keys_file)
    return create_app(build_coordinator(config, replica_id), access, serve)
