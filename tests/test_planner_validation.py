"""The planner's tau estimates against the simulator (``ampd.run.simulate.simulate``), both
in steady state (AMPD.md section 6).

Setting: Qwen3-32B on 8 x H20, HotpotQA-like at 1.5 sessions/s, one steady-state run
(warm-up, window, drain); every feasible plan with Z <= 1 simulated as plain PD
disaggregation (``pd-disagg``, local share 0), the system whose routing the queueing
model describes exactly (one FCFS queue in front of the prefill replicas). The same
sessions, thresholds and measurement window go to both: the planner reads the load
inside the window and takes its P95s over the sessions arriving in it, as the
simulator's summary does.

Tolerances, and why: the prefill side is a queue replayed on the nominal stream, whose
rounds run at the ITL threshold rather than at the ITL each plan delivers, and whose
history reads are taken as fully overlapped; the decode side is analytic, the
simulator's decode deterministic given the batch. Measured here (estimate / simulated,
every stable plan): TTFT 0.95-1.02 (mean scope) and 1.00-1.05 (strict), ITL 0.99-1.00
and 0.97-1.01. We allow 0.85-1.15 x for TTFT and 0.95-1.05 x for ITL, and ask that the
plan the planner ranks first be within 2 points of attainment of the best simulated
one (it is the best here in both scopes). On transient runs of 120 sessions (before
steady-state runs) the same comparison gave 0.83-1.13 and 0.96-1.13.

Every plan with Z <= 1 should carry the rate, so its run should be stable; but the verdict's
halves check has a fixed 2-point tolerance, and a plan far below 90 % attainment has more
sampling noise than that: under the strict scope one plan (P:<TP=1,DP=6> D:<TP=1,DP=2>, 72.8 %)
reads 70.5 % over its first half. At most one plan may be judged unstable so, with its slowdown
flat and the gap within sampling noise; its latencies are then not compared.
"""

import math

import numpy as np
import pytest

from ampd.config import RunConfig, override
from ampd.run.resolve import measure_for, perf_model_for, sessions_for
from ampd.run.simulate import simulate
from ampd.metrics.slo import SloScope, session_latencies
from ampd.planner import enumerate_plans, estimate_tau
from ampd.policy.routing import SloThresholds
from ampd.run.sweep import resolve_measure, resolve_slo


def _simulated_p95(out, scope: str) -> tuple[float, float]:
    """P95 TTFT and ITL of the measured sessions, in the planner's sense of ``scope``."""
    if scope == "strict":
        return out.summary.ttft_p95_s, out.summary.itl_p95_s
    window = (out.plan.warmup_s, out.plan.warmup_s + out.plan.window_s)
    measured = [r for r in out.result.sessions if window[0] <= r.arrival_s < window[1]]
    latencies = np.array([session_latencies(r, SloScope.MEAN) for r in measured])
    return float(np.percentile(latencies[:, 0], 95)), float(np.percentile(latencies[:, 1], 95))


@pytest.mark.parametrize("scope", ["mean", "strict"])
def test_tau_estimates_match_the_simulator_in_steady_state(scope):
    config = resolve_measure(resolve_slo(override(
        RunConfig(), system="pd-disagg", cluster={"model": "Qwen3-32B", "num_gpus": 8}, slo={"scope": scope},
        workload={"name": "hotpotqa", "rate_per_s": 1.5})))
    perf = perf_model_for(config)
    plan = measure_for(config, perf)
    sessions = sessions_for(config, plan)
    window_s = (plan.warmup_s, plan.warmup_s + plan.window_s)
    table = estimate_tau(sessions, perf, SloThresholds(config.slo.ttft_s, config.slo.itl_s), 8, 8, 0.0, scope,
                         window_s=window_s)
    plans = [p for p in enumerate_plans(table) if p.objective <= 1.0]
    assert len(plans) >= 10
    attainment, noisy = [], 0
    for p in plans:
        out = simulate(override(config, cluster={"deployment": str(p.deployment)}), sessions)
        attainment.append(out.summary.slo_attainment)
        if not out.stability.stable:
            # Not overloaded (Z <= 1): judged unstable only by the 2-point halves check, with a
            # gap within 3 standard errors of sampling noise (first half against the whole of
            # n sessions: sqrt(a (1 - a) (2 / n - 1 / n))); its latencies are not compared.
            a, n = out.summary.slo_attainment, out.summary.num_sessions
            gap = abs(a - out.stability.attainment_half)
            assert out.stability.slowdown_growth <= 0.2 and "first half" in out.stability.reason, out.stability
            assert gap <= 3 * math.sqrt(a * (1 - a) / n), (str(p.deployment), out.stability.reason)
            noisy += 1
            continue
        ttft_s, itl_s = _simulated_p95(out, scope)
        assert 0.85 <= p.prefill.p95_s / ttft_s <= 1.15, (str(p.deployment), p.prefill.p95_s, ttft_s)
        assert 0.95 <= p.decode.p95_s / itl_s <= 1.05, (str(p.deployment), p.decode.p95_s, itl_s)
    assert noisy <= 1
    assert attainment[0] >= max(attainment) - 0.02
