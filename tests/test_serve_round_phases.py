"""A served round's TTFT split into phases (``ampd.serve.rounds.phases``), on
hand-made traces whose every stamp is written by hand."""

import pytest

from ampd.serve.rounds.phases import PHASES, phases_s
from ampd.serve.rounds.round import RoundTrace


def test_a_remote_round_splits_into_the_stamps_and_the_dispatchers_timings():
    # Arrived at 10.0, routed at 10.002, its prefill's outcome back at 10.090 after 0.004 s
    # queued, 0.020 exporting and 0.050 in the prefill engine; first token at 10.130.
    trace = RoundTrace("s", ready_s=10.0, local=False, routed_s=10.002, kv_ready_s=10.090,
                       remote_phases_s={"queue": 0.004, "export": 0.020, "prefill": 0.050})
    label, phases = phases_s(trace, 10.130)
    assert label == "remote" and tuple(phases) == PHASES["remote"]
    assert phases == pytest.approx({"route": 0.002, "queue": 0.004, "export": 0.020, "prefill": 0.050,
                                    "handoff": 0.014, "first_token": 0.040})
    assert sum(phases.values()) == pytest.approx(0.130)


@pytest.mark.parametrize("changes, label", [
    ({}, "local"),
    ({"fallback": "timeout"}, "fallback"),
    ({"rebinds": 1, "local": False, "kv_ready_s": 10.05}, "rebind"),
])
def test_a_round_without_a_remote_prefill_has_its_route_and_its_first_token(changes, label):
    trace = RoundTrace("s", ready_s=10.0, routed_s=10.002, **changes)
    got, phases = phases_s(trace, 10.100)
    assert got == label and tuple(phases) == PHASES[label]
    assert phases == pytest.approx({"route": 0.002, "first_token": 0.098})


def test_a_round_served_without_the_store_is_all_first_token():
    # routed_s unset: the degraded path (coordinator._prepare_degraded clears it)
    label, phases = phases_s(RoundTrace("s", ready_s=10.0), 10.100)
    assert label == "local" and phases == pytest.approx({"route": 0.0, "first_token": 0.100})
