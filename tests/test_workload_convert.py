"""Format dispatch and format guessing."""

from pathlib import Path

import pytest

from ampd.core.errors import InputError
from ampd.workload import FORMATS, convert, convert_mooncake, guess_format, load_any, save_trace

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("path, fmt", [
    (DATA / "trtllm", "trtllm"),
    (DATA / "trtllm" / "django__django-16801.trace.json", "trtllm"),
    (DATA / "mooncake_tiny.jsonl", "mooncake"),
    (DATA / "tracelab_round_trace.jsonl", "tracelab"),
    (DATA / "session_delay_small.jsonl", "session-delay"),
])
def test_guess_format(path, fmt):
    assert guess_format(path) == fmt
    assert load_any(path) == convert(path, fmt)


def test_own_format_is_recognised(tmp_path):
    sessions = convert_mooncake(DATA / "mooncake_tiny.jsonl")
    path = tmp_path / "own.jsonl"
    save_trace(sessions, path)
    assert guess_format(path) == "ampd"
    assert load_any(path) == sessions


def test_unknown_format_lists_the_known_ones():
    with pytest.raises(InputError) as info:
        convert(DATA / "mooncake_tiny.jsonl", "sharegpt")
    assert all(fmt in str(info.value) for fmt in FORMATS)


def test_unrecognised_content_asks_for_a_format(tmp_path):
    path = tmp_path / "odd.jsonl"
    path.write_text('{"prompt": "hi"}\n')
    with pytest.raises(InputError, match="odd.jsonl: cannot tell the trace format"):
        load_any(path)
