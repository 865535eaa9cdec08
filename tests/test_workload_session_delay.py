"""session_id + delay converter on tests/data/session_delay_small.jsonl:
  chat-1: delay 2000 ms on its first line -> arrives at 2.0 s; its second line
          waits 1500 ms after round 0 -> round 0's tool_s = 1.5; third line no delay
  7:      timestamp 500 ms -> arrives at 0.5 s; second line delay 250.5 ms
  late:   neither -> arrives at 0
"""

from pathlib import Path

import pytest

from ampd.core.errors import InputError
from ampd.core.session import Round, Session
from ampd.workload import convert_session_delay

DATA = Path(__file__).parent / "data"


def test_small_file_as_worked_out_by_hand():
    assert convert_session_delay(DATA / "session_delay_small.jsonl") == [
        Session("late", 0.0, (Round(100, 10),)),
        Session("7", 0.5, (Round(300, 20, 0.2505), Round(25, 10))),
        Session("chat-1", 2.0, (Round(500, 40, 1.5), Round(60, 30, 0.0), Round(80, 45))),
    ]


@pytest.mark.parametrize("name, line, field", [
    ("session_delay_bad_json.jsonl", 2, "json"),
    ("session_delay_missing_field.jsonl", 2, "output_length|output_tokens: missing"),
    ("session_delay_negative_delay.jsonl", 3, "delay"),
    ("session_delay_both_keys.jsonl", 1, "input_length|input_tokens: both given"),
    ("session_delay_late_timestamp.jsonl", 2, "timestamp"),
    ("session_delay_wrong_type.jsonl", 1, "session_id"),
])
def test_broken_file_names_file_line_and_field(name, line, field):
    with pytest.raises(InputError) as info:
        convert_session_delay(DATA / "broken" / name)
    assert f"{name}:{line}: {field}" in str(info.value)


def test_timestamp_and_delay_together_on_a_first_line(tmp_path):
    path = tmp_path / "both.jsonl"
    path.write_text('{"session_id": "a", "input_length": 1, "output_length": 1, "timestamp": 0, "delay": 5}\n')
    with pytest.raises(InputError, match="both.jsonl:1: timestamp\\|delay"):
        convert_session_delay(path)
