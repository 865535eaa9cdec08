"""Synthetic workloads: reproducible, and their means are the paper's figures
(AMPD.md section 4) over many sessions."""

import numpy as np
import pytest

from ampd.core.errors import InputError
from ampd.workload import WORKLOADS, generate

NUM_SESSIONS = 2000
REL_TOLERANCE = 0.05  # a few standard errors at 2000 sessions (specs: CV of rounds ~0.7)


def _generate(workload, seed=0, rate_per_s=2.0):
    return generate(workload, NUM_SESSIONS, rate_per_s, np.random.default_rng(seed))


def test_same_seed_same_sessions_other_seed_other_sessions():
    assert generate("gaia", 50, 1.0, np.random.default_rng(7)) == generate("gaia", 50, 1.0, np.random.default_rng(7))
    assert generate("gaia", 50, 1.0, np.random.default_rng(7)) != generate("gaia", 50, 1.0, np.random.default_rng(8))


@pytest.mark.parametrize("workload, mean_rounds", [("toolbench", 3.96), ("gaia", 11.32)])
def test_agent_rounds_mean_is_the_papers(workload, mean_rounds):
    rounds = [len(s.rounds) for s in _generate(workload)]
    assert np.mean(rounds) == pytest.approx(mean_rounds, rel=REL_TOLERANCE)


@pytest.mark.parametrize("workload", ["hotpotqa", "dureader"])
def test_rag_has_three_retrievals(workload):
    for session in _generate(workload)[:100]:
        assert len(session.rounds) == 4
        assert all(r.tool_s > 0 for r in session.rounds[:3])


@pytest.mark.parametrize("workload, mean_prefill_tokens", [
    ("toolbench", 703), ("gaia", 6161), ("dureader", 3081)])
def test_initial_prompt_mean_is_the_papers_prefill(workload, mean_prefill_tokens):
    firsts = [s.rounds[0].input_tokens for s in _generate(workload)]
    assert np.mean(firsts) == pytest.approx(mean_prefill_tokens, rel=REL_TOLERANCE)


def test_gaia_decode_mean_is_the_papers():
    outputs = [r.output_tokens for s in _generate("gaia") for r in s.rounds]
    assert np.mean(outputs) == pytest.approx(528, rel=REL_TOLERANCE)


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_sessions_are_valid_and_arrive_at_the_rate(workload):
    sessions = _generate(workload, rate_per_s=2.0)
    assert all(r.input_tokens >= 1 and r.output_tokens >= 1 for s in sessions for r in s.rounds)
    assert all(s.rounds[-1].tool_s == 0.0 for s in sessions)
    gaps_s = np.diff([0.0] + [s.arrival_s for s in sessions])
    assert np.all(gaps_s >= 0.0)
    assert gaps_s.mean() == pytest.approx(0.5, rel=REL_TOLERANCE)
    assert len({s.session_id for s in sessions}) == NUM_SESSIONS


def test_every_spec_field_says_where_it_came_from():
    for spec in WORKLOADS.values():
        for dist in (spec.rounds, spec.first_input_tokens, spec.later_input_tokens, spec.output_tokens, spec.tool_s):
            assert dist.source


def test_unknown_workload_lists_the_known_ones():
    with pytest.raises(InputError) as info:
        generate("sharegpt", 3, 1.0, np.random.default_rng(0))
    assert all(name in str(info.value) for name in ("toolbench", "gaia", "hotpotqa", "dureader"))
