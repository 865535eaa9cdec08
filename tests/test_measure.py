"""Steady-state measurement (AMPD.md section 6; ``ampd.measure``): what counts, the
verdict and the capacity search, on cases worked out by hand; an overloaded point
found unstable; the same points on a local Ray cluster as on the process pool."""

import json
import math

import pytest

from ampd.config import RunConfig, override
from ampd.core import Deployment, Round, Session
from ampd.core.errors import InputError
from ampd.run.simulate import simulate
from ampd.measure import (
    STABLE, TRANSIENT, UNSTABLE, CapacitySearch, MeasurePlan, UnloadedLifetimes, find_capacities, judge,
    slo_lifetime_s)
from ampd.measure.capacity import meets_slo
from ampd.measure.plan import MIN_WINDOW_SESSIONS, measure_plan
from ampd.measure.window import measure_window
from ampd.metrics.records import RoundRecord, SessionRecord
from ampd.metrics.slo import SloScope
from ampd.metrics.summary import summarize
from ampd.policy.reorder import Fcfs
from ampd.policy.routing import AlwaysLocalRouter
from ampd.run.runner import PointRunner
from ampd.sim.cluster import SimCluster
from ampd.core.limits import RunLimits
from ampd.run.sweep import resolve
from stub_perf import StubPerf

# One replica, every prefill local (stub: prefill 1 ms/token, decode step 20 ms).
# s0 (t = 0, 5000 tokens): TTFT 5 s, misses a 1 s threshold. Window [10, 20): s1 at 10 and
# s2 at 15 (100 tokens: TTFT 0.1 s) attain; s1 ends 10.12, s2 15.14 (two steps). s3 at 25
# would miss (5 s again) but arrives after the window.
SESSIONS = [Session("s0", 0.0, (Round(5000, 2),)), Session("s1", 10.0, (Round(100, 2),)),
            Session("s2", 15.0, (Round(100, 3),)), Session("s3", 25.0, (Round(5000, 2),))]
UNLOADED = UnloadedLifetimes(StubPerf(), 1)
PLAN = MeasurePlan(warmup_s=10.0, window_s=10.0, drain_s=80.0, lifetime_s=1.0, slo_lifetime_s=2.0,
                   unloaded=UNLOADED)


def _cluster() -> SimCluster:
    return SimCluster(Deployment.parse("D:<TP=1,DP=1>").workers(8), StubPerf(), AlwaysLocalRouter(), Fcfs())


def test_only_sessions_arriving_in_the_window_count():
    result = _cluster().run(SESSIONS, RunLimits(10.0, 20.0, 100.0, 100))
    # the run ends when s2, the last measured session, ends: s3 never arrives
    assert [s.session_id for s in result.sessions] == ["s0", "s1", "s2"]
    assert result.end_s == pytest.approx(15.14) and result.stopped is None
    summary, stability = measure_window(result.sessions, PLAN, 1.0, 0.05, SloScope.MEAN)
    assert summary.num_sessions == 2 and summary.slo_attainment == 1.0
    assert summary.goodput_sessions_per_s == pytest.approx(2 / 10.0)  # attaining sessions per window second
    assert stability.attainment_half == 1.0  # s1 is the first half
    # two sessions are no steady state: the verdict says so rather than calling it stable
    assert stability.verdict == TRANSIENT and "too short" in stability.reason
    # the same sessions counted whole: s0 and s3 miss, half attain
    everything = _cluster().run(SESSIONS)
    assert summarize(everything.sessions, 1.0, 0.05).slo_attainment == 0.5


def test_a_run_that_cannot_drain_is_stopped_and_unstable():
    # window [0, 20), drain 1 s: s0's 30 s prefill outlasts it, and s1, s2 queue behind it.
    slow = [Session("s0", 0.0, (Round(30_000, 2),)), *SESSIONS[1:3]]
    result = _cluster().run(slow, RunLimits(0.0, 20.0, 21.0, 100))
    assert result.end_s <= 21.0 and "still running" in result.stopped
    plan = MeasurePlan(warmup_s=0.0, window_s=20.0, drain_s=1.0, lifetime_s=1.0, slo_lifetime_s=2.0,
                       unloaded=UNLOADED)
    summary, stability = measure_window(result.sessions, plan, 1.0, 0.05, SloScope.MEAN, result.stopped)
    assert summary.num_complete == 0 and stability.verdict == UNSTABLE


def test_too_many_sessions_in_the_system_stops_the_run():
    crowd = [Session(f"c{i}", 0.01 * i, (Round(5000, 2),)) for i in range(10)]
    result = _cluster().run(crowd, RunLimits(0.0, 1.0, 100.0, 3))
    assert len(result.sessions) == 4 and result.stopped.startswith("overloaded")


def test_unloaded_and_slo_lifetimes_by_hand():
    # StubPerf: prefill 1 ms per new token, step 20 ms. Two rounds: 100 new tokens and 3 outputs,
    # a 2 s tool call, then 50 new tokens and 1 output: 0.1 + 2 x 0.02 + 2 + 0.05 = 2.19 s.
    session = Session("s", 0.0, (Round(100, 3, tool_s=2.0), Round(50, 1)))
    assert UNLOADED.session_s(session) == pytest.approx(2.19)
    # its record, 100 of the second round's 103 history tokens evicted and recomputed (cached 3,
    # new 50 + 100): unloaded, they are history again; the tool call as it happened (3.5 - 1.0 s)
    record = SessionRecord("s", 0.0, 2, [RoundRecord("s", 0, 0.0, 0, 100, 3, 0, done_s=1.0),
                                         RoundRecord("s", 1, 3.5, 3, 150, 1, 0, recomputed_tokens=100)])
    assert UNLOADED.record_s(record) == pytest.approx(0.1 + 0.04 + 2.5 + 0.05)
    # SLO lifetime, TTFT 1 s and ITL 0.1 s: (1 + 2 x 0.1) + 2 (tool) + (1 + 0) = 4.2 s
    assert slo_lifetime_s([session], 1.0, 0.1) == pytest.approx(4.2)


def test_verdict_by_hand():
    # window [0, 100): (arrival, lifetime, unloaded). First quarter: lifetimes 2 and 4 s over
    # unloaded 1 and 2 s: slowdown 6 / 3 = 2, each session's residual y - 2x = 0: no error.
    # Last quarter: 6 and 11 over 2 and 4: slowdown 17 / 6 = 2.83. Whole window (these and one
    # at 50: 3 over 1): 26 / 10 = 2.6. Growth (2.83 - 2) / 2.6 = 32 % over a standard error of
    # sqrt(0 + ((6 - 2.83 x 2)^2 + (11 - 2.83 x 4)^2) / (2 x 1 x 3^2)) = 0.11: 7.5 errors, growing.
    sessions = [(0.0, 2.0, 1.0), (10.0, 4.0, 2.0), (50.0, 3.0, 1.0), (80.0, 6.0, 2.0), (90.0, 11.0, 4.0)]
    growing = judge(0.95, 0.95, sessions, 0.0, 100.0, None)
    assert growing.verdict == UNSTABLE and "slowdown grew 32 %" in growing.reason
    assert growing.slowdown_growth == pytest.approx((17 / 6 - 2) / 2.6)
    assert growing.slowdown == pytest.approx(2.6)
    # the same slowdowns with the last quarter's residuals five times larger (4 and 13): the
    # error 0.56, the growth 1.5 errors: noise, not growth
    noisy = [(0.0, 2.0, 1.0), (10.0, 4.0, 2.0), (50.0, 3.0, 1.0), (80.0, 4.0, 2.0), (90.0, 13.0, 4.0)]
    assert judge(0.95, 0.95, noisy, 0.0, 100.0, None).verdict == STABLE
    # long sessions arriving late are not growth: slowdown 2 in every quarter, whatever the sizes
    sizes = [(0.0, 2.0, 1.0), (10.0, 2.2, 1.1), (80.0, 40.0, 20.0), (90.0, 60.0, 30.0)]
    assert judge(0.95, 0.95, sizes, 0.0, 100.0, None).slowdown_growth == pytest.approx(0.0)
    # attainment: 2.0 points apart is still stable, 2.5 is not, nor a first half without sessions
    assert judge(0.92, 0.90, [], 0.0, 100.0, None).verdict == STABLE
    moving = judge(0.925, 0.90, [], 0.0, 100.0, None)
    assert moving.verdict == UNSTABLE and "first half" in moving.reason
    assert judge(1.0, float("nan"), [], 0.0, 100.0, None).verdict == UNSTABLE


def test_phases_that_cannot_give_a_figure_are_refused():
    with pytest.raises(InputError, match="measure.drain_s"):
        measure_plan(UNLOADED, 30.0, 70.0, 1.0, drain_s=10.0)  # shorter than a lifetime: never finish
    with pytest.raises(InputError, match="sessions"):
        measure_plan(UNLOADED, 30.0, 70.0, 1e6)  # a billion sessions
    with pytest.raises(InputError, match="SLO session lifetime"):
        measure_plan(UNLOADED, 30.0, float("nan"), 1.0)


def test_default_phases_scale_with_the_lifetimes_and_the_rate():
    # unloaded lifetime 30 s, SLO lifetime 70 s: warm-up 2 x 70; window max(10 x 30, 2000 / rate);
    # drain max(10 x 30, window / 4)
    slow = measure_plan(UNLOADED, 30.0, 70.0, 1.0)
    assert (slow.warmup_s, slow.window_s, slow.drain_s) == (140.0, MIN_WINDOW_SESSIONS / 1.0, 500.0)
    fast = measure_plan(UNLOADED, 30.0, 70.0, 100.0)
    assert (fast.window_s, fast.drain_s) == (300.0, 300.0)
    assert measure_plan(UNLOADED, 30.0, 70.0, 1.0, warmup_s=5.0, window_s=50.0, drain_s=37.0).horizon_s == 92.0


def test_capacity_search_brackets_the_crossing_by_hand():
    # meets the SLO below 0.37 sessions/s only. From 1.0: 1.0 and 0.5 miss, 0.25 meets; then
    # sqrt(0.25 x 0.5) = 0.354 meets, 0.420 misses, 0.386 misses, 0.369 meets: bracket
    # [0.369, 0.386], within 5 %: seven runs, the capacity the last rate met.
    def evaluate(batch):
        return [{"slo_attainment": 1.0 if rate < 0.37 else 0.0, "verdict": STABLE} for _, rate in batch]
    (search,) = searches = [CapacitySearch(1.0)]
    find_capacities(searches, evaluate)
    assert search.capacity_per_s <= 0.37 < search.high_per_s <= 1.05 * search.capacity_per_s
    assert len(search.rows) == 7 and search.bounded
    met = math.sqrt(0.25 * 0.5)
    missed = math.sqrt(math.sqrt(met * 0.5) * met)
    assert search.capacity_per_s == pytest.approx(math.sqrt(met * missed))
    assert search.high_per_s == pytest.approx(missed)


def test_a_rate_that_meets_the_slo_above_one_that_did_not_is_not_the_capacity():
    search = CapacitySearch(0.02)
    search.record(0.02, {"slo_attainment": 0.95, "verdict": STABLE})
    search.record(0.005, {"slo_attainment": 0.95, "verdict": UNSTABLE})
    # the capacity lies below the lowest miss: search down from there
    assert search.low_per_s is None and search.next_rate() == pytest.approx(0.0025)
    search.record(0.0025, {"slo_attainment": 0.95, "verdict": STABLE})
    assert (search.low_per_s, search.high_per_s) == (0.0025, 0.005)
    assert search.next_rate() == pytest.approx(math.sqrt(0.0025 * 0.005))


def test_an_unstable_point_never_meets_the_slo():
    assert meets_slo({"slo_attainment": 0.95, "verdict": STABLE})
    assert not meets_slo({"slo_attainment": 0.95, "verdict": UNSTABLE})
    assert not meets_slo({"slo_attainment": 0.85, "verdict": STABLE})


BASE = override(RunConfig(), system="pd-disagg", cluster={"deployment": "P:<TP=2,DP=2> D:<TP=4,DP=1>"},
                workload={"name": "toolbench"})


def test_an_overloaded_point_is_unstable_and_a_light_one_stable():
    light = simulate(resolve(override(BASE, workload={"rate_per_s": 0.3})))
    assert light.stability.verdict == STABLE
    assert abs(light.summary.slo_attainment - light.stability.attainment_half) <= 0.02
    assert light.summary.num_sessions >= MIN_WINDOW_SESSIONS * 0.9  # Poisson around 2,000
    # three times what the even split can prefill: the queues grow for as long as the run lasts
    heavy = simulate(resolve(override(BASE, workload={"rate_per_s": 3.0})))
    assert heavy.stability.verdict == UNSTABLE and heavy.row()["verdict"] == UNSTABLE


def test_a_steady_state_run_repeats_exactly_from_its_resolved_config():
    config = resolve(override(BASE, workload={"rate_per_s": 0.5}, measure={"window_s": 300.0}))
    assert config.measure.warmup_s is not None and config.measure.drain_s is not None
    assert simulate(config).row() == simulate(config).row()


def test_the_ray_path_gives_the_process_pools_rows():
    configs = [resolve(override(BASE, workload={"rate_per_s": r}, measure={"window_s": 200.0})) for r in (0.3, 0.6)]
    pool = PointRunner(2, progress=False)(configs)
    on_ray = PointRunner(2, progress=False, ray_address="local")(configs)
    assert json.dumps(on_ray) == json.dumps(pool) and len(pool) == 2  # as text: NaN fields compare equal


def test_a_batch_that_fails_part_way_keeps_the_points_that_finished(tmp_path, monkeypatch):
    # The cache is written as each point finishes: a sweep interrupted (or failing) at its
    # second point resumes without running the first again.
    configs = [override(BASE, seed=s) for s in (1, 2)]
    ran = []

    def point(data):
        if data["seed"] == 2:
            raise RuntimeError("the second point fails")
        ran.append(data["seed"])
        return {"seed": data["seed"]}

    monkeypatch.setattr("ampd.run.runner._point", point)
    runner = PointRunner(1, progress=False, cache_dir=tmp_path)
    with pytest.raises(RuntimeError):
        runner(configs)
    assert ran == [1] and len(list(tmp_path.iterdir())) == 1
    assert runner(configs[:1]) == [{"seed": 1}] and ran == [1]  # read back, not run again


def test_the_point_cache_digest_covers_every_module_a_point_runs():
    # A cached row is reused while the digest is unchanged: every ampd module that
    # ``simulate`` imports, directly or not, must be inside the digest.
    import ast
    from pathlib import Path

    from ampd.run.runner import _POINT_CODE
    root = Path(__file__).resolve().parent.parent / "src" / "ampd"
    seen, todo = set(), ["run/simulate.py", "run/runner.py"]
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        for node in ast.walk(ast.parse((root / rel).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ampd."):
                parts = node.module.split(".")[1:]
                target = root.joinpath(*parts)
                todo.append(str((target / "__init__.py" if target.is_dir() else target.with_suffix(".py"))
                                .relative_to(root)))
    outside = sorted(rel for rel in seen if rel not in _POINT_CODE and rel.split("/")[0] not in _POINT_CODE)
    assert outside == [], outside
