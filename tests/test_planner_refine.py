"""The simulation-refined top-k (``[planner] refine_top_k``): the planner's k best plans
put in the order their steady-state runs rank them, here with a stub runner whose rows
are written by hand (the simulator itself is tested elsewhere)."""

import pytest

from ampd.config import RunConfig, override
from ampd.core.deployment import Role
from ampd.core.errors import InputError
from ampd.run.plan_refine import refine, simulate_capacities
from ampd.planner import Plan, TauCell
from ampd.run.planning import knee_rate_per_s, plan_for


class StubRunner:
    """Answers every configuration with the row written for its deployment, and keeps
    the deployments it was asked to run."""

    def __init__(self, rows: dict[str, tuple[str, float]]) -> None:
        self.rows, self.asked = rows, []

    def __call__(self, configs: list[RunConfig]) -> list[dict]:
        self.asked += [c.cluster.deployment for c in configs]
        return [{"verdict": self.rows[c.cluster.deployment][0], "slo_attainment": self.rows[c.cluster.deployment][1],
                 "ttft_mean_s": 1.0, "ttft_p95_s": 2.0, "itl_p95_s": 0.05, "local_prefill_share": 0.1}
                for c in configs]


def _plan(prefill_dp: int, decode_dp: int) -> Plan:
    return Plan(TauCell(Role.PREFILL, 1, prefill_dp, 0.5, 1.0, 0, 100),
                TauCell(Role.DECODE, 1, decode_dp, 0.05, 0.1, 0, 100), "optimal")


def test_refine_puts_the_top_k_in_simulated_order_and_leaves_the_rest():
    a, b, c, d = _plan(1, 1), _plan(1, 2), _plan(2, 1), _plan(2, 2)
    runner = StubRunner({str(a.deployment): ("unstable", 0.90), str(b.deployment): ("stable", 0.80),
                         str(c.deployment): ("stable", 0.95)})
    # stable runs by attainment (c 95 %, b 80 %), then the unstable a whatever its figure;
    # d, 4th, is not simulated and stays after them
    assert refine(RunConfig(), [a, b, c, d], 3, runner) == [c, b, a, d]
    assert runner.asked == [str(a.deployment), str(b.deployment), str(c.deployment)]


def test_plan_for_with_refine_takes_the_simulated_best_of_the_planners_top_k():
    config = override(RunConfig(), system="pd-disagg", workload={"name": "toolbench", "num_sessions": 40,
                                                                  "rate_per_s": 1.0})
    top = [str(p.deployment) for p in plan_for(config, 3)]
    # the planner's 3rd plan simulates best, its 1st is unstable: refined, the 3rd comes first
    runner = StubRunner({top[0]: ("unstable", 0.99), top[1]: ("stable", 0.90), top[2]: ("stable", 0.97)})
    refined = plan_for(override(config, planner={"refine_top_k": 3}), 1, runner=runner)
    assert [str(p.deployment) for p in refined] == [top[2]] and runner.asked == top


class RateRunner:
    """Answers each configuration as if its deployment carried the SLO (stable,
    95 %) up to a capacity written by hand and collapsed (unstable, 50 %) above it."""

    def __init__(self, capacities: dict[str, float]) -> None:
        self.capacities, self.asked = capacities, []

    def __call__(self, configs: list[RunConfig]) -> list[dict]:
        rows = []
        for c in configs:
            self.asked.append(c.cluster.deployment)
            meets = c.workload.rate_per_s <= self.capacities[c.cluster.deployment]
            rows.append({"rate_per_s": c.workload.rate_per_s, "verdict": "stable" if meets else "unstable",
                         "slo_attainment": 0.95 if meets else 0.5, "reason": ""})
        return rows


def test_refine_by_capacity_ranks_the_top_k_by_the_load_each_carries():
    a, b, c, d = _plan(1, 1), _plan(1, 2), _plan(2, 1), _plan(2, 2)
    true = {str(a.deployment): 1.5, str(b.deployment): 3.0, str(c.deployment): 0.8}
    config = override(RunConfig(), workload={"rate_per_s": 1.0})
    runner = RateRunner(true)
    # b carries the most, then a, then c; d, 4th, is not searched
    assert refine(config, [a, b, c, d], 3, runner, by="capacity") == [b, a, c, d]
    assert set(runner.asked) == set(true)
    # each capacity is a rate measured to meet the SLO within 5 % of where it stops (the search's precision)
    found = simulate_capacities(config, [a.deployment, b.deployment, c.deployment], RateRunner(true))
    assert all(t / 1.05 <= f <= t for f, t in zip(found, true.values()))


def test_refine_by_capacity_refuses_a_transient_run():
    config = override(RunConfig(), workload={"num_sessions": 40})
    with pytest.raises(InputError, match="steady-state"):
        refine(config, [_plan(1, 1)], 1, RateRunner({}), by="capacity")


def test_plan_for_by_capacity_draws_its_plans_at_the_planners_knee_and_takes_the_highest():
    config = override(RunConfig(), system="pd-disagg", workload={"name": "toolbench", "rate_per_s": 1.0})
    knee = knee_rate_per_s(config)
    # The knee, checked against the planner itself: its best plan keeps Z <= 1 there and
    # none does one search step (5 %) above.
    assert plan_for(override(config, workload={"rate_per_s": knee}), 1)[0].objective <= 1.0
    try:
        above = plan_for(override(config, workload={"rate_per_s": knee * 1.05}), 1)[0].objective
    except InputError:
        above = float("inf")
    assert above > 1.0
    drawn = [str(p.deployment) for p in plan_for(override(config, workload={"rate_per_s": knee}), 3)]
    # capacities by hand: the knee's 3rd plan carries the most
    runner = RateRunner({drawn[0]: 1.2, drawn[1]: 0.9, drawn[2]: 1.6})
    refined = plan_for(override(config, planner={"refine_top_k": 3, "refine_by": "capacity"}), 1, runner=runner)
    assert [str(p.deployment) for p in refined] == [drawn[2]] and set(runner.asked) == set(drawn)


def test_refine_refuses_an_unknown_ranking():
    with pytest.raises(InputError, match="refine_by"):
        refine(RunConfig(), [_plan(1, 1)], 1, RateRunner({}), by="latency")
