"""The project's trace format: round trip, ordering, and error messages."""

from pathlib import Path

import pytest

from ampd.core.errors import InputError
from ampd.core.session import Round, Session
from ampd.workload import load_trace, save_trace

BROKEN = Path(__file__).parent / "data" / "broken"


def test_round_trip_keeps_every_field(tmp_path):
    sessions = [
        Session("s1", 0.0, (Round(703, 120, 1.2), Round(350, 80))),
        Session("s2", 0.25, (Round(10, 1),)),
    ]
    path = tmp_path / "t.jsonl"
    save_trace(sessions, path)
    assert load_trace(path) == sessions


def test_tool_s_defaults_to_zero_and_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('\n{"session_id": "a", "arrival_s": 0, "rounds": '
                    '[{"input_tokens": 5, "output_tokens": 2}]}\n\n')
    assert load_trace(path) == [Session("a", 0.0, (Round(5, 2, 0.0),))]


def test_sessions_come_back_sorted_by_arrival_ties_in_file_order(tmp_path):
    path = tmp_path / "t.jsonl"
    lines = [f'{{"session_id": "{sid}", "arrival_s": {t}, "rounds": [{{"input_tokens": 1, "output_tokens": 1}}]}}'
             for sid, t in [("late", 3.0), ("tie-1", 1.0), ("early", 0.5), ("tie-2", 1.0)]]
    path.write_text("\n".join(lines))
    assert [s.session_id for s in load_trace(path)] == ["early", "tie-1", "tie-2", "late"]


@pytest.mark.parametrize("name, line, field", [
    ("ampd_bad_json.jsonl", 3, "json"),
    ("ampd_missing_field.jsonl", 2, "arrival_s"),
    ("ampd_negative_tokens.jsonl", 2, "rounds[1].input_tokens"),
    ("ampd_duplicate_id.jsonl", 4, "session_id"),
    ("ampd_wrong_type.jsonl", 1, "rounds[0].input_tokens"),
    ("ampd_no_rounds.jsonl", 1, "rounds"),
])
def test_broken_file_names_file_line_and_field(name, line, field):
    with pytest.raises(InputError) as info:
        load_trace(BROKEN / name)
    message = str(info.value)
    assert f"{name}:{line}: {field}" in message


def test_duplicate_id_names_both_lines():
    with pytest.raises(InputError, match=r"ampd_duplicate_id.jsonl:4: session_id: .*'s1'.*line 1"):
        load_trace(BROKEN / "ampd_duplicate_id.jsonl")


def test_unknown_key_is_an_error(tmp_path):
    path = tmp_path / "typo.jsonl"
    path.write_text('{"session_id": "a", "arrival_s": 0, "rounds": [{"input_token": 5, "output_tokens": 2}]}\n')
    with pytest.raises(InputError, match=r"typo.jsonl:1: .*rounds\[0\]\.input_token"):
        load_trace(path)


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-1.0"])
def test_arrival_must_be_finite_and_not_negative(tmp_path, bad):
    path = tmp_path / "t.jsonl"
    path.write_text(f'{{"session_id": "a", "arrival_s": {bad}, "rounds": [{{"input_tokens": 1, "output_tokens": 1}}]}}\n')
    with pytest.raises(InputError, match="t.jsonl:1: arrival_s"):
        load_trace(path)


def test_empty_and_missing_files_are_errors(tmp_path):
    with pytest.raises(InputError, match="empty.jsonl: empty"):
        load_trace(BROKEN / "empty.jsonl")
    with pytest.raises(InputError, match="nothing.jsonl: cannot read"):
        load_trace(tmp_path / "nothing.jsonl")
