"""Engines that share a host slow each other (``ampd.sim.shared_host``,
``ampd.profile.neighbour_probe``): steps stretched by hand-computed overlaps, the
simulator on cases worked out by hand (times from tests/stub_perf.py), and the rule that
turns a profile's neighbour probes into a factor."""

import pytest

from ampd.core import Deployment, Round, Session
from ampd.policy.reorder import Fcfs
from ampd.policy.routing import AlwaysRemoteRouter
from ampd.profile.neighbour_probe import NeighbourPoint, decode_step_factor
from ampd.profile.scrape import ProbeError
from ampd.sim.cluster import SimCluster
from ampd.sim.shared_host import stretched_step_s
from stub_perf import StubPerf


@pytest.mark.parametrize("start_s, busy, expected_s", [
    (0.0, [], 0.02),                      # nobody computes
    (0.1, [(0.0, 1.0)], 0.04),            # busy all through: twice as long
    (0.0, [(0.0, 0.01)], 0.025),          # 0.01 s at half speed does 0.005; 0.015 left at full speed
    (0.0, [(0.01, 1.0)], 0.03),           # 0.01 s quiet does 0.01; the other 0.01 at half speed takes 0.02
    (0.0, [(0.005, 0.015), (0.0, 0.01)], 0.0275),  # one spell, 0 to 0.015 (0.0075 done), then 0.0125 alone
    (0.0, [(0.0, 0.004), (0.006, 0.008)], 0.023),  # 0.002 + 0.002 + 0.001 done in 0.008 s, 0.015 left
    (0.5, [(0.0, 0.5)], 0.02),            # ended when the step starts
    (0.0, [(0.03, 1.0)], 0.02),           # starts after the step would end
    (0.0, [(0.01, 0.005)], 0.02),         # empty (ends before it starts): none
])
def test_a_step_runs_at_half_speed_while_a_neighbour_computes(start_s, busy, expected_s):
    assert stretched_step_s(start_s, 0.02, busy, 2.0) == pytest.approx(expected_s)


class SharedHostStub(StubPerf):
    """``StubPerf`` whose decode steps take twice as long beside a computing prefill engine,
    and whose second remote compute stage to start (b's below) begins with ``export_s`` on
    the decode engine."""

    decode_step_factor_beside_prefill = 2.0

    def __init__(self, export_s: float = 0.0) -> None:
        super().__init__()
        self.export_s, self._exports = export_s, 0

    def remote_export_s(self, hist_tokens, prefill, decode):
        # Asked as each compute stage starts: a's first, b's second (neither has history to
        # tell them apart by).
        self._exports += 1
        return self.export_s if self._exports == 2 else 0.0


def _itls(perf, gpus_per_server: int = 8) -> list[float]:
    # a: remote prefill of 100 tokens, 0 to 0.1 s; KV back 0.001 s -> first token 0.101, then 4 steps.
    # b: queued behind it, its prefill of 1,000 tokens computes 0.1 to 1.1 s on the same prefill worker.
    a = Session("a", 0.0, (Round(100, 5),))
    b = Session("b", 0.0, (Round(1000, 2),))
    specs = Deployment.parse("P:<TP=1,DP=1> D:<TP=1,DP=1>").workers(2, gpus_per_server)
    result = SimCluster(specs, perf, AlwaysRemoteRouter(), Fcfs()).run([a, b])
    return list(result.sessions[0].rounds[0].itls_s)


def test_decode_steps_beside_a_computing_prefill_engine_on_the_same_server_take_factor_times_as_long():
    assert _itls(StubPerf()) == pytest.approx([0.02] * 4)
    # Every step of a (0.101 to 0.261) meets b's prefill (0.1 to 1.1): 2 x 20 ms each.
    assert _itls(SharedHostStub()) == pytest.approx([0.04] * 4)


def test_a_prefill_engine_on_another_server_slows_nothing():
    # One GPU a server: the prefill replica on server 0, the decode replica on server 1.
    assert _itls(SharedHostStub(), gpus_per_server=1) == pytest.approx([0.02] * 4)


def test_the_history_export_that_leads_a_measured_remote_compute_is_not_the_prefill_engine_at_work():
    # b's compute stage holds the prefill worker 0.1 to 1.1 s, but its first 0.5 s are the export on
    # the decode engine: the prefill engine computes from 0.6 s, after a's last step (0.161 to 0.181).
    assert _itls(SharedHostStub(export_s=0.5)) == pytest.approx([0.02] * 4)
    # 0.07 s of export: the engine computes from 0.17. a's steps end 0.121, 0.141, 0.161; the 4th
    # starts at 0.161: 0.009 s alone, then 0.011 of work at half speed (0.022 s) -> ends 0.192.
    assert _itls(SharedHostStub(export_s=0.07)) == pytest.approx([0.02, 0.02, 0.02, 0.031])


def _point(idle_s: float, busy_s: float) -> NeighbourPoint:
    return NeighbourPoint(4, 512, 1024, idle_s, busy_s, 30)


def test_a_slowdown_every_busy_run_shows_is_the_ratio_of_the_medians():
    points = [_point(0.005, 0.010), _point(0.006, 0.011), _point(0.0055, 0.0095)]
    reading = decode_step_factor(points)
    assert reading["separated"]
    assert reading["decode_step_factor"] == pytest.approx(0.010 / 0.0055)
    assert reading["neighbour_prefills"] == [30, 30, 30]


@pytest.mark.parametrize("points", [
    [_point(0.005, 0.0052), _point(0.0051, 0.0053)],                      # separated, but 4 % apart
    [_point(0.005, 0.010), _point(0.006, 0.011), _point(0.011, 0.0105)],  # one idle run slower than a busy one
    [_point(0.005, 0.005)],                                               # a mock: no neighbour at all
])
def test_a_slowdown_within_the_runs_own_scatter_is_no_slowdown(points):
    assert decode_step_factor(points)["decode_step_factor"] == 1.0


def test_an_idle_step_of_0_s_is_a_counter_that_did_not_move():
    with pytest.raises(ProbeError, match="did not move"):
        decode_step_factor([_point(0.0, 0.005)])


def test_a_stalled_engine_is_refused_not_read_as_a_neighbour():
    with pytest.raises(ProbeError, match="stalled engine"):
        decode_step_factor([_point(0.005, 0.06)])


def test_a_task_given_its_own_stages_is_timed_by_them_and_counts_all_of_its_compute_as_the_engines():
    # The mock engine's plain prefill: 0.3 s of compute, no read, no send, whatever the perf model
    # would make of a remote round of that size (StubPerf: 1 ms a token, 10 us a token each way).
    from ampd.core.deployment import Role, WorkerSpec
    from ampd.core.task import PrefillTask
    from ampd.perf.interface import RemoteStages
    from ampd.sim.engine import EventLoop
    from ampd.sim.prefill_worker import SimPrefillWorker

    class Sink:
        first_token_s = None

        def first_token(self, task, worker_id, local):
            Sink.first_token_s = loop.now_s

    loop, spec = EventLoop(), WorkerSpec(0, Role.PREFILL, 1, 0)
    worker = SimPrefillWorker(spec, loop, StubPerf(), Fcfs(), Sink(), 10.0, lambda _: spec)
    worker.enqueue(PrefillTask("s", 0, 0, 1000, 0.0, 0), RemoteStages(0.0, 0.3, 0.0))
    seen = []
    loop.at(0.1, lambda: seen.append(worker.engine_busy_s))
    loop.run(10.0)
    assert seen == [(0.0, 0.3)]  # all of the compute is the prefill engine's
    assert Sink.first_token_s == pytest.approx(0.3)  # a remote round of 1,000 tokens would take 1.01 s
