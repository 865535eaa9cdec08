"""Infeasible input refused with the reason, and the memory constraint binding in a
crafted case (``stub_perf``: prefill 1 ms per new token at any TP, decode step 20 ms)."""

import numpy as np
import pytest

from ampd.core import Round, Session
from ampd.core.errors import InputError
from ampd.perf import build_perf_model
from ampd.planner import enumerate_plans, estimate_tau, plan_deployments, top_plans
from ampd.policy.routing import SloThresholds
from ampd.run.slo_rule import derive_slo
from ampd.workload import generate
from stub_perf import StubPerf

SLO = SloThresholds(ttft_s=5.0, itl_s=0.05)


class TpCapacityPerf(StubPerf):
    """StubPerf whose KV capacity depends on the TP degree."""

    def __init__(self, capacity_by_tp: dict[int, int]) -> None:
        super().__init__()
        self.capacity_by_tp = capacity_by_tp

    def kv_capacity_tokens(self, tp: int) -> int:
        return self.capacity_by_tp[tp]


def _waiting_sessions(prompt_tokens=1000):
    """40 sessions, one a second, each holding its prompt's KV through a 100 s tool call:
    all of them resident at once, but only 10 tokens of decode per round."""
    return [Session(f"s{i}", float(i), (Round(prompt_tokens, 10, 100.0), Round(10, 10))) for i in range(40)]


def _llama(num_sessions=60, rate=1.0):
    perf = build_perf_model("Llama-3.1-70B", "H20")
    sessions = generate("toolbench", num_sessions, rate, np.random.default_rng(0))
    return sessions, perf, derive_slo(perf, sessions)


def _refusal(*args, **kwargs) -> str:
    with pytest.raises(InputError) as err:
        plan_deployments(*args, **kwargs)
    return str(err.value)


def test_model_that_fits_nowhere_is_refused():
    assert "does not fit in memory at any degree" in _refusal(_waiting_sessions(), StubPerf(0), SLO, 8)


def test_too_few_gpus_for_one_prefill_and_one_decode_replica():
    sessions, perf, slo = _llama()
    message = _refusal(sessions, perf, slo, 3)  # Llama-3.1-70B needs TP 2 on H20
    assert "too few GPUs" in message and "need 4" in message and "has 3" in message


def test_overload_is_named():
    sessions, perf, slo = _llama(num_sessions=600, rate=60.0)
    message = _refusal(sessions, perf, slo, 8)
    assert "overload" in message and "every prefill choice is overloaded" in message


def test_memory_is_named_when_no_decode_set_holds_the_resident_kv():
    message = _refusal(_waiting_sessions(), TpCapacityPerf({1: 3000, 2: 3000, 4: 3000, 8: 3000}), SLO, 8)
    assert "memory" in message and "resident sessions" in message


def test_gpu_budget_is_named_when_each_role_fits_alone_but_not_both():
    # 240 s of prefill over the stream's 140 s: two prefill replicas at least. Decode
    # memory for a seventh of the resident KV: seven decode replicas. 2 + 7 > 8 GPUs.
    sessions = _waiting_sessions(prompt_tokens=6000)
    roomy = estimate_tau(sessions, StubPerf(), SLO, 8)
    assert [c.overloaded for c in roomy.prefill[:2]] == [True, False]
    resident = next(c.kv_tokens for c in roomy.decode if (c.tp, c.dp) == (1, 1))
    perf = TpCapacityPerf(dict.fromkeys((1, 2, 4, 8), -(-resident // 7)))
    message = _refusal(sessions, perf, SLO, 8)
    assert "GPU budget" in message and "need 9 GPUs" in message


@pytest.mark.parametrize("kwargs,message", [({"top_k": 0}, "top_k must be >= 1"),
                                            ({"solver": "cplex"}, "unknown solver 'cplex'")])
def test_bad_arguments_are_refused(kwargs, message):
    sessions, perf, slo = _llama()
    assert message in _refusal(sessions, perf, slo, 8, **kwargs)


def test_memory_constraint_binds_in_a_crafted_case():
    # Every degree is as fast as every other with the stub and no prefill runs locally, so
    # without memory limits the planner takes the fewest GPUs: one TP-1 decode replica.
    # Give TP 1 too little KV memory for the 40 resident sessions and it must take a
    # bigger degree instead.
    sessions = _waiting_sessions()
    roomy = TpCapacityPerf(dict.fromkeys((1, 2, 4, 8), 10**7))
    tight = TpCapacityPerf({1: 3000, 2: 10**7, 4: 10**7, 8: 10**7})
    free_best = plan_deployments(sessions, roomy, SLO, 8, local_share=0.0)[0]
    assert str(free_best.deployment).endswith("D:<TP=1,DP=1>")
    table = estimate_tau(sessions, tight, SLO, 8, local_share=0.0)
    best = top_plans(table, 1)[0]
    assert best.decode.tp == 2 and best.decode.kv_tokens <= best.decode.kv_capacity_tokens
    assert all(c.kv_tokens > 3000 and not c.overloaded for c in table.decode if c.tp == 1)
    assert str(enumerate_plans(table)[0].deployment) == str(best.deployment)
