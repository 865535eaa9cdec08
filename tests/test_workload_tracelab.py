"""TraceLab converter on the shipped example (tests/data/tracelab_round_trace.jsonl,
a verbatim copy); expected values read off the file by hand."""

from pathlib import Path

import pytest

from ampd.core.errors import InputError
from ampd.core.session import Round
from ampd.workload import convert_tracelab

DATA = Path(__file__).parent / "data"
EXAMPLE = DATA / "tracelab_round_trace.jsonl"


def test_example_sessions_match_the_file():
    codex, claude = convert_tracelab(EXAMPLE)
    assert codex.session_id == "codex:a611041f-625d-6fad-5e59-845850dc6543"
    assert claude.session_id == "claude:92ee5b8a-429c-e80b-5db6-5381512f4697"
    assert (len(codex.rounds), len(claude.rounds)) == (9, 10)
    # codex starts first (2026-03-21T10:05:59.328Z); claude at 2026-06-01T05:40:20.151Z,
    # 72 days minus 4 h 25 min 39.177 s later
    assert codex.arrival_s == 0.0
    assert claude.arrival_s == pytest.approx(72 * 86400 - (4 * 3600 + 25 * 60 + 39.177))


def test_first_round_takes_the_total_and_later_rounds_the_appended_tokens():
    codex, claude = convert_tracelab(EXAMPLE)
    # claude round 0: input_tokens_total 32272, output 931, tools Bash 860 ms and WebSearch 19291 ms
    assert claude.rounds[0] == Round(32272, 931, 19.291)
    # round 1: newly_append_tokens 6360, output 1016, one WebSearch of 12688 ms
    assert claude.rounds[1] == Round(6360, 1016, 12.688)
    # round 4: no tool
    assert claude.rounds[4] == Round(460, 1275, 0.0)
    # codex round 0: three parallel exec_command of 67, 79, 1176 ms
    assert codex.rounds[0] == Round(9324, 444, 1.176)
    # codex round 3: newly_append_tokens 6696 (cache miss), tools 91 and 176 ms
    assert codex.rounds[3] == Round(6696, 233, 0.176)


@pytest.mark.parametrize("name, line, field", [
    ("tracelab_bad_json.jsonl", 1, "json"),
    ("tracelab_duplicate_round.jsonl", 3, "round_index: 1 repeated"),
    ("tracelab_negative_tokens.jsonl", 2, "newly_append_tokens"),
    ("tracelab_naive_time.jsonl", 1, "timing_events[0].timestamp"),
    ("tracelab_no_timing.jsonl", 1, "timing_events"),
    ("tracelab_wrong_type.jsonl", 1, "tools[0].tool_wall_latency_ms"),
])
def test_broken_file_names_file_line_and_field(name, line, field):
    with pytest.raises(InputError) as info:
        convert_tracelab(DATA / "broken" / name)
    assert f"{name}:{line}: {field}" in str(info.value)


def test_duplicate_round_names_the_first_line():
    with pytest.raises(InputError, match="first on line 2"):
        convert_tracelab(DATA / "broken" / "tracelab_duplicate_round.jsonl")
