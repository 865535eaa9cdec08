"""One simulation run from a RunConfig: the resolved configuration
(``ampd.run.resolve``) through the simulator, measured in steady state
(``ampd.measure``) unless ``workload.num_sessions`` makes it a transient run."""

from __future__ import annotations

import random
from dataclasses import dataclass

from ampd.config import RunConfig
from ampd.core.session import Session
from ampd.measure import TRANSIENT, MeasurePlan, Stability, measure_window
from ampd.metrics.slo import SloScope
from ampd.metrics.summary import RunSummary, summarize
from ampd.policy.routing import SloThresholds
from ampd.policy.systems import get_system
from ampd.run.resolve import (
    arrivals_scale, check_runnable, knobs_for, measure_for, perf_model_for, rate_for, sessions_for, slo_for)
from ampd.sim.cluster import SimCluster, SimResult, WorkerOptions


@dataclass
class RunOutput:
    """A finished run.

    Attributes:
        config: what ran.
        slo: the thresholds.
        summary: figures over the measured sessions (the window's, or all of a
            transient run's).
        result: the simulator's raw output (every session that arrived).
        plan: the run's phases (None for a transient run).
        stability: the verdict (``ampd.measure.verdict``).
    """

    config: RunConfig
    slo: SloThresholds
    summary: RunSummary
    result: SimResult
    plan: MeasurePlan | None
    stability: Stability

    def row(self) -> dict:
        """The run as one flat row: what ran, the summary and the verdict."""
        c = self.config
        plan = {"warmup_s": self.plan.warmup_s, "window_s": self.plan.window_s} if self.plan else {}
        return {"system": c.system, "workload": c.workload.label, "rate_per_s": rate_for(c),
                "arrivals": c.workload.arrival_process, "arrivals_scale": arrivals_scale(c),
                "model": c.cluster.model, "num_gpus": c.cluster.num_gpus, "deployment": c.cluster.deployment,
                "ttft_slo_s": self.slo.ttft_s, "itl_slo_s": self.slo.itl_s, **self.summary.to_dict(),
                **self.stability.to_dict(), **plan, "num_sessions_run": len(self.result.sessions),
                "num_events": self.result.num_events}


def simulate(config: RunConfig, sessions: list[Session] | None = None) -> RunOutput:
    """Run ``config`` through the simulator (on ``sessions`` instead of the
    configured ones when given).

    Raises:
        InputError: as ``check_runnable``; unknown system, model or GPU.
    """
    system = get_system(config.system)
    specs = check_runnable(config)
    perf = perf_model_for(config)
    slo = slo_for(config, perf)
    plan = measure_for(config, perf, slo)
    sessions = sessions if sessions is not None else sessions_for(config, plan)
    p = config.policy
    knobs = knobs_for(config, perf)
    router = system.make_router(perf, slo, knobs, random.Random(config.seed))
    scope = config.slo.scope
    # A session's ITL slack is a mean-scope budget; under the strict scope the decode
    # workers report none, which a router reads as no slack (docs/SIMULATOR.md, "SLO routing").
    # Kept only for a router that reads it.
    tracks_slack = system.reads_itl_slack and scope is SloScope.MEAN
    options = WorkerOptions(p.window_s, knobs.batching, system.kv_retention, p.pin_ttl_s,
                            slo.itl_s if tracks_slack else None)
    cluster = SimCluster(specs, perf, router, system.make_queue_policy(slo, knobs), options)
    if plan is None:
        result = cluster.run(sessions)
        summary = summarize(result.sessions, slo.ttft_s, slo.itl_s, scope)
        return RunOutput(config, slo, summary, result, None, Stability(TRANSIENT, "a fixed number of sessions"))
    result = cluster.run(sessions, plan.limits(rate_for(config)))
    summary, stability = measure_window(result.sessions, plan, slo.ttft_s, slo.itl_s, scope, result.stopped)
    return RunOutput(config, slo, summary, result, plan, stability)
