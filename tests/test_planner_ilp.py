"""The planner's ILP against a brute force written here, SCIP against scipy's milp,
and the top-k list (AMPD.md section 2; docs/PLANNER.md)."""

import itertools

import numpy as np
import pytest

from ampd.core.deployment import Deployment, Role
from ampd.core.errors import InputError
from ampd.perf import build_perf_model
from ampd.planner import enumerate_plans, estimate_tau, top_plans
from ampd.run.slo_rule import derive_slo
from ampd.workload import generate

# (model, workload, rate per 8 GPUs): light and heavy loads, so that some instances have
# saturated (exactly tied) taus and others overloaded cells.
INSTANCES = [
    ("Llama-3.1-70B", "toolbench", 1.0), ("Llama-3.1-70B", "dureader", 0.3),
    ("Qwen3-32B", "hotpotqa", 0.5), ("Qwen3-32B", "gaia", 0.2), ("Qwen3-32B", "toolbench", 4.0),
    ("Mixtral-8x7B", "dureader", 2.0), ("Mixtral-8x7B", "toolbench", 0.2), ("Llama-3.1-8B", "gaia", 0.5),
]
CLUSTERS = [(4, 8), (6, 8), (8, 8), (12, 8), (16, 8), (12, 6), (16, 4)]  # (GPUs, GPUs per server)


def _table(model, workload, rate_per_8, num_gpus, per_server, local_share=0.2):
    perf = build_perf_model(model, "H20")
    sessions = generate(workload, 50, rate_per_8 * num_gpus / 8, np.random.default_rng(3))
    return estimate_tau(sessions, perf, derive_slo(perf, sessions), num_gpus, per_server, local_share)


def _brute_force(table):
    """Every deployment with one degree per role within the budget, best first, ranked
    as docs/PLANNER.md says: the worse normalised tau (Z), then at an exact tie the
    binding set's GPUs, role and degree, then the other set's tau, GPUs, role, degree."""
    cells = {(c.role, c.tp, c.dp): c for c in table.cells}
    n = table.num_gpus
    ranked = []
    for tp_p, tp_d in itertools.product((1, 2, 4, 8), repeat=2):
        for dp_p, dp_d in itertools.product(range(1, n + 1), repeat=2):
            p, d = cells.get((Role.PREFILL, tp_p, dp_p)), cells.get((Role.DECODE, tp_d, dp_d))
            if p is None or d is None or p.p95_s is None or d.p95_s is None or d.kv_tokens > d.kv_capacity_tokens:
                continue
            text = f"P:<TP={tp_p},DP={dp_p}> D:<TP={tp_d},DP={dp_d}>"
            try:
                Deployment.parse(text).workers(n, table.gpus_per_server)
            except InputError:
                continue
            sides = sorted([(p.p95_s / p.threshold_s, tp_p * dp_p, 0, tp_p),
                            (d.p95_s / d.threshold_s, tp_d * dp_d, 1, tp_d)], reverse=True)
            ranked.append((sides[0] + sides[1], text))
    return [text for _, text in sorted(ranked)]


def _names(plans):
    return [str(p.deployment) for p in plans]


@pytest.mark.parametrize("model,workload,rate", INSTANCES)
def test_ilp_top5_equals_brute_force_on_every_cluster_up_to_16_gpus(model, workload, rate):
    checked = 0
    for num_gpus, per_server in CLUSTERS:
        try:
            table = _table(model, workload, rate, num_gpus, per_server)
        except InputError:
            continue  # too few GPUs for this model: refused, tested elsewhere
        expected = _brute_force(table)
        assert _names(enumerate_plans(table)) == expected
        plans = top_plans(table, 5, "scip")
        assert _names(plans) == expected[:5]
        assert all(p.status == "optimal" for p in plans)
        checked += bool(expected)
    assert checked >= 3


@pytest.mark.parametrize("local_share", [0.0, 0.2])
@pytest.mark.parametrize("model,workload,rate", INSTANCES[::2])
def test_scip_and_milp_find_the_same_plans(model, workload, rate, local_share):
    table = _table(model, workload, rate, 16, 8, local_share)
    scip, milp = top_plans(table, 4, "scip"), top_plans(table, 4, "milp")
    assert _names(scip) == _names(milp)
    assert [p.objective for p in scip] == [p.objective for p in milp]
    assert all(p.status == "optimal" for p in scip + milp)


def test_top_k_distinct_sorted_and_kth_is_the_kth_of_enumeration():
    table = _table("Qwen3-32B", "toolbench", 4.0, 16, 8)
    everything = enumerate_plans(table)
    for k in (1, 3, 7):
        plans = top_plans(table, k)
        assert len(plans) == k and len(set(_names(plans))) == k
        assert [p.objective for p in plans] == sorted(p.objective for p in plans)
        assert [p.order_key for p in plans] == sorted(p.order_key for p in plans)
        assert str(plans[-1].deployment) == str(everything[k - 1].deployment)


def test_fewer_plans_than_asked_when_fewer_are_feasible():
    table = _table("Llama-3.1-70B", "toolbench", 0.5, 4, 8)  # only TP 2 fits: P:<2,1> D:<2,1>
    assert _names(top_plans(table, 3)) == ["P:<TP=2,DP=1> D:<TP=2,DP=1>"]


def test_packing_rows_exclude_plans_the_servers_cannot_hold():
    # 2 servers of 6 GPUs: three TP-4 replicas fit the budget (12) but not the servers.
    table = _table("Qwen3-32B", "toolbench", 4.0, 12, 6)
    cells = {(c.role, c.tp, c.dp): c for c in table.cells}
    unpackable = [(2, 1), (1, 2)]
    assert all(cells[(Role.PREFILL, 4, p)].usable and cells[(Role.DECODE, 4, d)].usable for p, d in unpackable)
    names = _names(top_plans(table, 100))
    assert len(names) > 10
    assert not {f"P:<TP=4,DP={p}> D:<TP=4,DP={d}>" for p, d in unpackable} & set(names)
    for name in names:
        Deployment.parse(name).workers(12, 6)
