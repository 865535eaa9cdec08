"""Named serving systems: which router and which queue policy (AMPD and its
baselines, AMPD.md section 4). Every runtime builds its policies from here."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from ampd.core.errors import InputError
from ampd.core.names import unknown_name
from ampd.perf.interface import PerfModel
from ampd.policy.batching import Batching, measured_batching
from ampd.policy.deadline import DeadlineReorder
from ampd.policy.reorder import Fcfs, QueuePolicy, ReturningFirst, TtftAwareReorder
from ampd.policy.routing import (
    AdaptiveRouter, AlwaysLocalRouter, AlwaysRemoteRouter, PredictiveRouter, Router, SloThresholds,
    ThresholdRouter)
from ampd.policy.slo_routing import SLACK_HORIZON_TOKENS, SloRouter


@dataclass(frozen=True)
class Knobs:
    """The systems' constants: AMPD's hyper-parameters (paper defaults: alpha 0.9,
    beta 0.85, w 3), Dynamo's conditional-disaggregation thresholds
    (``ThresholdRouter``: 2048 tokens, 0.7 of the prompt, 2 waiting tasks), the
    deadline-aware queues' starvation bound (``DeadlineReorder``: 16 postponements,
    [our choice], measured in docs/RESULTS.md, "Where reordering earns its keep"),
    ``ampd-slo``'s slack horizon (32 tokens, ``slo_routing.SLACK_HORIZON_TOKENS``) and
    the decode engines' batching the adaptive routers estimate ``t_local`` under
    (``decode_batching``; default the paper's pause), and whether those engines
    take a chunk size per local prefill (``per_task_chunks``: the simulator's do;
    a served vLLM's token budget is engine-wide, so ``ampd serve`` sets False)."""

    alpha: float = 0.9
    beta: float = 0.85
    reorder_window: int = 3
    dynamo_max_local_prefill_tokens: int = 2048
    dynamo_max_uncached_ratio: float = 0.7
    dynamo_busy_queue_tasks: int = 2
    max_postponements: int = 16
    slo_slack_horizon_tokens: int = SLACK_HORIZON_TOKENS
    batching: Batching = Batching()
    per_task_chunks: bool = True


@dataclass(frozen=True)
class System:
    """A router and a queue policy under one name.

    Attributes:
        name: what results call it.
        description: one line for tables and docs.
        needs_prefill_workers: False when it can run on decode workers alone.
        colocated: True for vLLM-style replicas that prefill and decode (the
            deployment then has decode replicas only, ``D:<TP=n,DP=k>``).
        batching: how decode workers mix prefills with decode steps
            (``alternate``, ``prefill-first``, ``chunked``).
        kv_retention: what a session's KV does during a tool call
            (``resident``, ``lru``, ``pinned``).
        adaptive: True for AMPD's adaptive routing and its variants, whose
            share of local prefills the planner must provision for.
        reads_itl_slack: True when its router reads the decode batch's ITL slack
            (``WorkerView.min_itl_slack_s``); the simulator's decode workers keep
            that figure only then (it costs a heap operation per sequence and step).
    """

    name: str
    description: str
    make_router: Callable[[PerfModel, SloThresholds, Knobs, random.Random], Router]
    make_queue_policy: Callable[[SloThresholds, Knobs], QueuePolicy]
    needs_prefill_workers: bool = True
    colocated: bool = False
    batching: str = "alternate"
    kv_retention: str = "resident"
    adaptive: bool = False
    reads_itl_slack: bool = False


def _adaptive(perf: PerfModel, slo: SloThresholds, knobs: Knobs, rng: random.Random) -> Router:
    return AdaptiveRouter(perf, slo, rng, knobs.alpha, knobs.beta, knobs.batching)


def _predictive(perf: PerfModel, slo: SloThresholds, knobs: Knobs, rng: random.Random) -> Router:
    return PredictiveRouter(perf, slo, rng, knobs.alpha, knobs.beta, knobs.batching)


def _slo(perf: PerfModel, slo: SloThresholds, knobs: Knobs, rng: random.Random) -> Router:
    return SloRouter(perf, slo, knobs.alpha, knobs.batching, knobs.per_task_chunks,
                     knobs.slo_slack_horizon_tokens)


def _threshold(length_rule: bool, busy_rule: bool) -> Callable[[PerfModel, SloThresholds, Knobs, random.Random],
                                                                Router]:
    """A maker of Dynamo's threshold router with the given rules and the knobs' thresholds."""
    def make(perf: PerfModel, slo: SloThresholds, knobs: Knobs, rng: random.Random) -> Router:
        return ThresholdRouter(length_rule, busy_rule, knobs.dynamo_max_local_prefill_tokens,
                               knobs.dynamo_max_uncached_ratio, knobs.dynamo_busy_queue_tasks)
    return make


def _local(perf: PerfModel, slo: SloThresholds, knobs: Knobs, rng: random.Random) -> Router:
    return AlwaysLocalRouter()


def _remote(perf: PerfModel, slo: SloThresholds, knobs: Knobs, rng: random.Random) -> Router:
    return AlwaysRemoteRouter()


def _fcfs(slo: SloThresholds, knobs: Knobs) -> QueuePolicy:
    return Fcfs()


def _ttft_aware(slo: SloThresholds, knobs: Knobs) -> QueuePolicy:
    return TtftAwareReorder(slo.ttft_s, knobs.reorder_window)


def _deadline(slo: SloThresholds, knobs: Knobs) -> QueuePolicy:
    return DeadlineReorder(slo.ttft_s, knobs.max_postponements)


SYSTEMS: dict[str, System] = {s.name: s for s in (
    System("ampd", "AMPD: adaptive routing (Alg. 1) + TTFT-aware reordering (Alg. 2)",
           _adaptive, _ttft_aware, needs_prefill_workers=False, adaptive=True),
    System("ampd-predictive", "AMPD with a queue-aware prefill signal (ours, not the paper's) + Alg. 2",
           _predictive, _ttft_aware, needs_prefill_workers=False, adaptive=True),
    System("ampd-predictive-edf", "AMPD's predictive routing + deadline-aware queues: most tasks on time over "
           "the whole queue, EDF, starvation bound (ours)",
           _predictive, _deadline, needs_prefill_workers=False, adaptive=True),
    System("ampd-predictive-no-reorder", "ampd-predictive with FCFS queues (ablation)",
           _predictive, _fcfs, needs_prefill_workers=False, adaptive=True),
    System("ampd-slo", "prefills placed by predicted TTFT and the decode batch's ITL slack, local ones in "
           "slack-sized chunks (ours, not the paper's) + Alg. 2",
           _slo, _ttft_aware, needs_prefill_workers=False, batching="chunked", adaptive=True, reads_itl_slack=True),
    System("ampd-no-reorder", "AMPD routing with FCFS queues (ablation)",
           _adaptive, _fcfs, needs_prefill_workers=False, adaptive=True),
    System("ampd-edf", "AMPD routing with deadline-aware queues (ampd-predictive-edf's; ablation)",
           _adaptive, _deadline, needs_prefill_workers=False, adaptive=True),
    System("pd-disagg", "plain PD disaggregation (Dynamo): every prefill remote, FCFS",
           _remote, _fcfs),
    System("pd-disagg-reorder", "pd-disagg with TTFT-aware reordering (Alg. 2) on its queues (ablation)",
           _remote, _ttft_aware),
    System("pd-disagg-edf", "pd-disagg with deadline-aware queues (ampd-predictive-edf's; ablation)",
           _remote, _deadline),
    System("dynamo-length", "Dynamo conditional disaggregation: local when the uncached prefill is short "
           "(policy.dynamo_max_local_prefill_tokens, dynamo_max_uncached_ratio)",
           _threshold(length_rule=True, busy_rule=False), _fcfs),
    System("dynamo-busy", "Dynamo conditional disaggregation: local when the prefill queue is busy "
           "(policy.dynamo_busy_queue_tasks)", _threshold(length_rule=False, busy_rule=True), _fcfs),
    System("dynamo-conditional", "Dynamo conditional disaggregation: length rule OR busy rule",
           _threshold(length_rule=True, busy_rule=True), _fcfs),
    System("vllm", "vLLM colocated, V0 scheduling: waiting prefills run before the next decode step",
           _local, _fcfs, needs_prefill_workers=False, colocated=True, batching="prefill-first",
           kv_retention="lru"),
    System("vllm-chunked", "vLLM colocated, V1 chunked prefill (token budget per step)",
           _local, _fcfs, needs_prefill_workers=False, colocated=True, batching="chunked", kv_retention="lru"),
    System("continuum", "vLLM-Continuum: colocated, chunked, KV pinned across tool calls, returning sessions first",
           _local, lambda slo, knobs: ReturningFirst(), needs_prefill_workers=False, colocated=True,
           batching="chunked", kv_retention="pinned"),
)}


DECODE_BATCHING_SETTINGS = ("auto", "alternate", "chunked")
"""Values of ``[cluster] decode_batching`` (docs/CONFIG.md, "Engine batching")."""


def decode_batching(system: System, setting: str, chunk_tokens: int, perf: PerfModel) -> Batching:
    """How ``system``'s decode workers batch a local prefill with their decode steps.

    A colocated system's name fixes it (``vllm`` pauses for every waiting prefill,
    ``vllm-chunked`` and ``continuum`` chunk). A disaggregated system's decode
    workers run the engine ``setting`` names, with ``chunk_tokens`` per step;
    ``auto`` [our choice] is what the performance model measured on the real
    engine (``measured_batching``: its mode and token budget) when it has a
    measurement, else the system's own (AMPD as published: ``alternate``), since
    which one an engine does is a measurement, not a choice (issue 11).

    Raises:
        ValueError: a setting outside ``DECODE_BATCHING_SETTINGS``; a measured
            batching ``Batching`` refuses.
    """
    if setting not in DECODE_BATCHING_SETTINGS:
        raise ValueError(f"unknown decode batching {setting!r}; known: {', '.join(DECODE_BATCHING_SETTINGS)}")
    if system.colocated:
        return Batching(system.batching, chunk_tokens)
    if setting == "auto":
        return measured_batching(perf) or Batching(system.batching, chunk_tokens)
    return Batching(setting, chunk_tokens)


def get_system(name: str) -> System:
    """The system called ``name``.

    Raises:
        InputError: unknown name (the message lists the known ones, closest first).
    """
    try:
        return SYSTEMS[name]
    except KeyError:
        raise InputError(unknown_name("system", name, SYSTEMS)) from None
