"""TensorRT-LLM trace-replay converter. Expected values were read off the JSON
file by hand (tests/data/trtllm/django__django-16801.trace.json)."""

from pathlib import Path

import pytest

from ampd.core.errors import InputError
from ampd.workload import convert_trtllm

DATA = Path(__file__).parent / "data"
DJANGO = DATA / "trtllm" / "django__django-16801.trace.json"


def test_django_rounds_match_the_file():
    (session,) = convert_trtllm(DJANGO)
    assert session.session_id == "django__django-16801"
    assert session.arrival_s == 0.0
    # prompt_tokens 2426, 10751, 11210, 11640; completion_tokens 1444, 437, 205, 374
    assert [r.input_tokens for r in session.rounds] == [
        2426, 10751 - (2426 + 1444), 11210 - (10751 + 437), 11640 - (11210 + 205)]
    assert [r.input_tokens for r in session.rounds] == [2426, 6881, 22, 225]
    assert [r.output_tokens for r in session.rounds] == [1444, 437, 205, 374]
    # one tool_call after each assistant message: read_file, shell, shell, complete_task
    assert [r.tool_s for r in session.rounds] == pytest.approx(
        [0.1081840991973877, 0.03599667549133301, 0.04206395149230957, 0.004971027374267578])


def test_directory_finds_trace_files():
    assert convert_trtllm(DJANGO.parent) == convert_trtllm(DJANGO)


def test_tools_of_one_step_add_up_and_low_increments_clamp(tmp_path):
    path = tmp_path / "two.trace.json"
    path.write_text("""{"events": [
      {"event_type": "message", "branch_path": [], "role": "assistant", "prompt_tokens": 100, "completion_tokens": 0},
      {"event_type": "tool_call", "branch_path": [], "duration_ms": 250},
      {"event_type": "tool_call", "branch_path": [], "duration_ms": 750},
      {"event_type": "message", "branch_path": [], "role": "tool", "tokens": 3},
      {"event_type": "message", "branch_path": [], "role": "assistant", "prompt_tokens": 90, "completion_tokens": 7}
    ]}""")
    (session,) = convert_trtllm(path)
    assert [(r.input_tokens, r.output_tokens, r.tool_s) for r in session.rounds] == [(100, 1, 1.0), (1, 7, 0.0)]


@pytest.mark.parametrize("name, where", [
    ("trtllm_bad_json.trace.json", ":5: json"),
    ("trtllm_negative_tokens.trace.json", ": events[3]: completion_tokens"),
    ("trtllm_missing_field.trace.json", ": events[1]: duration_ms: missing"),
    ("trtllm_wrong_type.trace.json", ": events[0]: prompt_tokens"),
    ("trtllm_parallel.trace.json", ": events[1]: event_type"),
    ("trtllm_tool_first.trace.json", ": events[0]: event_type: tool_call before"),
])
def test_broken_file_names_file_and_event(name, where):
    with pytest.raises(InputError) as info:
        convert_trtllm(DATA / "broken" / name)
    assert name + where in str(info.value)


def test_directory_without_traces_is_an_error(tmp_path):
    with pytest.raises(InputError, match="no \\*.trace.json"):
        convert_trtllm(tmp_path)
