"""A trace replays at its recorded arrival times unless told otherwise (issue 15):
exactly as recorded by default, rescaled by ``--rate`` with the rate WORKLOADS.md
defines (``(n - 1) / span``), Poisson only when asked; every run says which."""

import json
from dataclasses import replace

import pytest

from ampd.cli.main import main
from ampd.config import RunConfig, override
from ampd.core.errors import InputError
from ampd.run.resolve import arrivals_scale, rate_for, sessions_for
from ampd.workload import arrival_rate_per_s, load_trace

ROUNDS = [{"input_tokens": 700, "output_tokens": 100, "tool_s": 1.0}, {"input_tokens": 300, "output_tokens": 50}]


@pytest.fixture
def trace(tmp_path):
    """Three sessions arriving at 0, 2.5 and 5.0 s."""
    path = tmp_path / "three.jsonl"
    path.write_text("".join(json.dumps({"session_id": f"s{i}", "arrival_s": t, "rounds": ROUNDS}) + "\n"
                            for i, t in enumerate([0.0, 2.5, 5.0])))
    return path


def _config(trace, **workload) -> RunConfig:
    return override(RunConfig(), workload={"name": None, "trace": str(trace), **workload})


def test_the_trace_rate_is_sessions_less_one_over_the_span(trace):
    # 2 gaps over 5 s; the same 0.4 whatever the clock's origin.
    sessions = load_trace(trace)
    assert arrival_rate_per_s(sessions) == 0.4
    shifted = [replace(s, arrival_s=s.arrival_s + 100.0) for s in sessions]
    assert arrival_rate_per_s(shifted) == 0.4


def test_a_trace_replays_its_recorded_times_by_default(trace):
    config = _config(trace, num_sessions=3)
    assert config.workload.arrival_process == "recorded"
    assert [s.arrival_s for s in sessions_for(config)] == [0.0, 2.5, 5.0]
    assert [s.session_id for s in sessions_for(config)] == ["s0", "s1", "s2"]
    assert rate_for(config) == 0.4 and arrivals_scale(config) == 1.0


def test_a_steady_state_run_repeats_the_recorded_times(trace):
    # Period = span + one mean gap = 5 + 2.5 s: the rate stays 0.4 across the seams.
    times = [s.arrival_s for s in sessions_for(_config(trace))]
    assert times[:7] == [0.0, 2.5, 5.0, 7.5, 10.0, 12.5, 15.0]


def test_rate_rescales_by_the_trace_rate(trace):
    # 0.8 sessions/s is twice the trace's 0.4: every time halves.
    config = _config(trace, num_sessions=3, rate_per_s=0.8)
    assert arrivals_scale(config) == 2.0
    assert [s.arrival_s for s in sessions_for(config)] == [0.0, 1.25, 2.5]
    steady = [s.arrival_s for s in sessions_for(_config(trace, rate_per_s=0.8))]
    assert steady[:5] == [0.0, 1.25, 2.5, 3.75, 5.0]


def test_rate_equal_to_the_trace_rate_replays_exactly(trace):
    config = _config(trace, num_sessions=3, rate_per_s=0.4)
    assert [s.arrival_s for s in sessions_for(config)] == [0.0, 2.5, 5.0]


def test_poisson_is_chosen_explicitly(trace):
    config = _config(trace, num_sessions=3, arrivals="poisson")
    times = [s.arrival_s for s in sessions_for(config)]
    assert times != [0.0, 2.5, 5.0] and times == sorted(times)
    assert rate_for(config) == 0.4 and arrivals_scale(config) is None  # Poisson at the trace's own rate


def test_synthetic_workloads_stay_poisson_at_one_per_second():
    config = RunConfig()
    assert config.workload.arrival_process == "poisson" and rate_for(config) == 1.0


def test_a_trace_without_distinct_arrivals_has_no_rate_of_its_own(tmp_path):
    path = tmp_path / "together.jsonl"
    path.write_text("".join(json.dumps({"session_id": f"s{i}", "arrival_s": 0.0, "rounds": ROUNDS}) + "\n"
                            for i in range(2)))
    with pytest.raises(InputError, match="--arrivals poisson --rate"):
        rate_for(_config(path, num_sessions=2))


def test_the_cli_says_which_arrivals_it_used_and_repeats_them(trace, tmp_path, capsys):
    out = tmp_path / "one"
    assert main(["simulate", "--workload", str(trace), "--num-sessions", "3", "--out", str(out)]) == 0
    assert "recorded arrivals, at the trace's own times" in capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["arrivals"], summary["arrivals_scale"], summary["rate_per_s"]) == ("recorded", 1.0, 0.4)
    saved = json.loads((out / "config.json").read_text())["workload"]
    assert (saved["arrivals"], saved["rate_per_s"]) == ("recorded", None)
    ready = [r.split(",")[2] for r in (out / "rounds.csv").read_text().splitlines()[1:] if r.split(",")[1] == "0"]
    assert ready == ["0.0", "2.5", "5.0"]
    again = tmp_path / "again"
    assert main(["simulate", "--config", str(out / "config.json"), "--out", str(again)]) == 0
    assert (again / "rounds.csv").read_text() == (out / "rounds.csv").read_text()

    assert main(["simulate", "--workload", str(trace), "--num-sessions", "3", "--rate", "0.8",
                 "--out", str(tmp_path / "fast")]) == 0
    assert "recorded arrivals, rescaled from the trace's own 0.4 sessions/s" in capsys.readouterr().out
    assert main(["simulate", "--workload", str(trace), "--num-sessions", "3", "--arrivals", "poisson",
                 "--out", str(tmp_path / "poisson")]) == 0
    assert "Poisson arrivals" in capsys.readouterr().out
