"""Whole simulations: reproducibility, conservation, and the policies' effects."""

import pytest

from ampd.config import RunConfig, override
from ampd.core.errors import InputError
from ampd.core import Round, Session
from ampd.run.resolve import sessions_for
from ampd.run.simulate import simulate
from ampd.policy.systems import SYSTEMS
from ampd.run.sweep import resolve_slo

BASE = override(RunConfig(), cluster={"deployment": "P:<TP=2,DP=2> D:<TP=4,DP=1>"},
                workload={"name": "toolbench", "num_sessions": 60, "rate_per_s": 1.0})


def _fingerprint(out):
    return [(r.session_id, r.round_index, r.first_token_s, r.done_s, r.prefill_worker)
            for s in out.result.sessions for r in s.rounds]


def test_same_seed_same_results_different_seed_different():
    a = simulate(resolve_slo(BASE))
    b = simulate(resolve_slo(BASE))
    assert _fingerprint(a) == _fingerprint(b)
    assert a.result.routes == b.result.routes
    c = simulate(resolve_slo(override(BASE, seed=1, workload={"seed": 1})))
    assert _fingerprint(c) != _fingerprint(a)


@pytest.mark.parametrize("system", sorted(SYSTEMS))
def test_every_round_completes_once_with_all_its_tokens(system):
    deployment = "D:<TP=4,DP=2>" if SYSTEMS[system].colocated else BASE.cluster.deployment
    out = simulate(resolve_slo(override(BASE, system=system, cluster={"deployment": deployment})))
    sessions = {s.session_id: s for s in sessions_for(out.config)}
    assert len(out.result.sessions) == len(sessions)
    for rec in out.result.sessions:
        spec = sessions[rec.session_id]
        assert rec.complete and len(rec.rounds) == len(spec.rounds)
        for r, want in zip(rec.rounds, spec.rounds):
            assert len(r.itls_s) == want.output_tokens - 1
            assert r.first_token_s >= r.ready_s
    assert len(out.result.routes) == sum(len(s.rounds) for s in sessions.values())


def test_pd_disagg_never_runs_local_and_needs_prefill_workers():
    out = simulate(resolve_slo(override(BASE, system="pd-disagg")))
    assert out.summary.local_prefill_share == 0.0
    with pytest.raises(InputError, match="needs prefill workers"):
        simulate(resolve_slo(override(BASE, system="pd-disagg", cluster={"deployment": "D:<TP=4,DP=2>"})))


def test_attainment_falls_as_rate_grows():
    config = resolve_slo(override(BASE, workload={"num_sessions": 150, "rate_per_s": 0.25}))
    low = simulate(config).summary.slo_attainment
    high = simulate(override(config, workload={"rate_per_s": 4.0})).summary.slo_attainment
    assert low >= 0.9 and high <= 0.3


def test_weights_that_do_not_fit_are_refused():
    # Llama-3.1-70B (141 GB of BF16 weights) cannot sit on one 96 GB H20.
    with pytest.raises(InputError, match="do not fit"):
        simulate(resolve_slo(override(BASE, cluster={"deployment": "P:<TP=1,DP=1> D:<TP=4,DP=1>"})))


def test_session_larger_than_any_decode_replica_is_refused():
    huge = [Session("huge", 0.0, (Round(700_000, 10),))]  # TP4 H20 holds about 624k tokens
    with pytest.raises(InputError, match="huge"):
        simulate(override(BASE, slo={"ttft_s": 1.0, "itl_s": 0.1}, cluster={"deployment": "P:<TP=4,DP=1> D:<TP=4,DP=1>"}),
                 huge)


def test_auto_deployment_is_the_planners_choice_or_the_colocated_default():
    from ampd.run.planning import plan_for
    from ampd.run.sweep import resolve
    auto = override(BASE, cluster={"deployment": "auto"})
    planned = resolve(auto)
    assert planned.cluster.deployment == str(plan_for(resolve_slo(auto), top_k=1)[0].deployment)
    # Llama-3.1-70B fits on 2 H20s, so the reference TP is 4: two colocated replicas on 8 GPUs.
    assert resolve(override(auto, system="vllm")).cluster.deployment == "D:<TP=4,DP=2>"
    with pytest.raises(InputError, match="'auto' must be resolved"):
        simulate(resolve_slo(auto))


def test_link_bandwidths_are_configurable():
    # 1000 tokens of Llama-3.1-70B KV = 327,680,000 bytes. Within a server, between TP 2 and TP 4, the
    # shards move over min(2, 4) = 2 GPU pairs at half the per-GPU NVLink figure each (50 GB/s): 100 GB/s
    # in all -> 3.2768 ms, plus the 50 us set-up. Between servers: 10 GB/s -> 32.768 ms + 50 us.
    from ampd.core import Role, WorkerSpec
    from ampd.run.resolve import perf_model_for
    perf = perf_model_for(override(BASE, cluster={"nvlink_gb_per_s": 100.0, "network_gb_per_s": 10.0}))
    p, d, far = WorkerSpec(0, Role.PREFILL, 2, 0), WorkerSpec(1, Role.DECODE, 4, 0), WorkerSpec(2, Role.DECODE, 4, 1)
    assert perf.kv_transfer_s(1000, p, d) == pytest.approx(327_680_000 / 100e9 + 50e-6)
    assert perf.kv_transfer_s(1000, p, far) == pytest.approx(327_680_000 / 10e9 + 50e-6)
