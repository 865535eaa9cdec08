"""The serving stack's share of a round, from a calibration run's coordinator phases and
client records (``ampd.profile.stack_probe``), worked out by hand; and its place in a
simulated round."""

import pytest

from ampd.core import Deployment, Round, Session
from ampd.metrics.records import RoundRecord, SessionRecord
from ampd.perf.model import AlphaBetaPerfModel
from ampd.policy.reorder import Fcfs
from ampd.policy.routing import AlwaysRemoteRouter
from ampd.profile.scrape import ProbeError
from ampd.profile.stack_probe import stack_from_phases
from ampd.sim.cluster import SimCluster
from hand_perf_file import hand_model

# Three remote rounds: route 2 ms, queue 8, export 0, prefill 50, handoff 6, first token 30 (96 ms in
# all); one local round: route 4 ms, first token 60 (64 ms).
PHASES = {"remote": {"rounds": 3, "route_s": 0.002, "queue_s": 0.008, "export_s": 0.0, "prefill_s": 0.05,
                     "handoff_s": 0.006, "first_token_s": 0.03},
          "local": {"rounds": 1, "route_s": 0.004, "first_token_s": 0.06}}


def _client(ttfts_s: list[float | None]) -> list[SessionRecord]:
    rounds = [RoundRecord("s", i, 10.0 * i, 0, 100, 2, 1, None if t is None else 10.0 * i + t)
              for i, t in enumerate(ttfts_s)]
    return [SessionRecord("s", 0.0, len(rounds), rounds)]


def test_the_stack_is_the_coordinators_phases_and_what_the_client_saw_beyond_them():
    # The client waited 110, 110, 110 and 80 ms (a fifth round failed before its first token):
    # 102.5 ms on average, against the coordinators' (3 x 96 + 64) / 4 = 88 ms: 14.5 ms its own.
    stack = stack_from_phases(PHASES, _client([0.11, 0.11, 0.11, 0.08, None]))
    # route over all four rounds: (3 x 2 + 4) / 4 = 2.5 ms; dispatch and handoff of the remote ones.
    assert stack == pytest.approx((0.0025, 0.008, 0.006, 0.0145))
    # A client faster than the coordinators' own clocks (they start and stop apart): 0, not negative.
    assert stack_from_phases(PHASES, _client([0.05])).client_s == 0.0


def test_a_calibration_with_no_remote_round_is_refused_naming_what_is_unmeasured():
    with pytest.raises(ProbeError, match="no calibration round was served remotely"):
        stack_from_phases({"local": PHASES["local"]}, _client([0.07]))
    with pytest.raises(ProbeError, match="served no round"):
        stack_from_phases({}, _client([0.07]))
    # Without prefill engines (colocated replicas) no round is remote: nothing to dispatch or
    # hand off. Route 4 ms; the client waited 70 ms against the coordinator's 64.
    assert stack_from_phases({"local": PHASES["local"]}, _client([0.07]), prefill_engines=False) == pytest.approx(
        (0.004, 0.0, 0.0, 0.006))


def test_a_simulated_round_waits_the_stack_where_serving_meets_it():
    # tests/hand_perf_file.py's model (T_pre 10 ms + 0.1 ms per new token at TP 1, 5 ms per engine
    # request) behind a stack of route 2, dispatch 8, handoff 6 and client 13 ms. A lone remote
    # first round of 1,000 tokens: route, client, dispatch and the prefill request's 5 ms before
    # the prefill engine (28 ms), the paper's read of its (empty) history at the link's 1 ms fixed
    # cost, 110 ms of T_pre, the 1,000 tokens' KV to the decode engine, then handoff and the
    # join's 5 ms (11 ms): TTFT 150 ms + the transfer; without the stack: 121 ms + the transfer.
    stack = {"route_s": 0.002, "dispatch_s": 0.008, "handoff_s": 0.006, "client_s": 0.013}
    plain = AlphaBetaPerfModel.from_dict(hand_model())
    with_stack = AlphaBetaPerfModel.from_dict({**hand_model(), "serving_stack": stack})
    session = Session("s", 0.0, (Round(1000, 2),))
    specs = Deployment.parse("P:<TP=1,DP=1> D:<TP=1,DP=1>").workers(8)
    transfer_s = 0.001 + 1e-9 * 131_072 * 1000  # the measured link

    def ttft_s(perf: AlphaBetaPerfModel) -> float:
        cluster = SimCluster(specs, perf, AlwaysRemoteRouter(), Fcfs())
        (record,) = cluster.run([session]).sessions[0].rounds
        return record.first_token_s - record.ready_s

    assert ttft_s(plain) == pytest.approx(0.121 + transfer_s)
    assert ttft_s(with_stack) == pytest.approx(0.150 + transfer_s)
