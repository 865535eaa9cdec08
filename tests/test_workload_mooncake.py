"""Mooncake converter on a hand-made file (tests/data/mooncake_tiny.jsonl) whose
chains were worked out by hand, and on the real trace when it is present.

The tiny file, lines 1-10 (block 0 = a system prompt held by all 10 requests;
with shared_fraction 0.45 a block is shared when held by > 4.5 requests, so
only block 0 is; block 3 is held by 4):
  A: 1 -> 4 -> 7    line 4 extends line 1's full blocks [0, 1]; so does line 7,
                    but line 1 already has a child: line 7 takes line 4
  B: 2 -> 6 -> 8    line 2 is exactly 2 blocks (1024 tokens), all full
  3, 5 separate     line 3's only full block is the shared block 0, so line 5
                    ([0, 6]) must not continue it
  9 separate        extends line 6 like line 8 does, but 6 already has a child
  10 separate       block 0 alone, partial
"""

from pathlib import Path

import pytest

from ampd.core.errors import InputError
from ampd.core.session import Round, Session
from ampd.workload import builtin_trace, convert_mooncake

DATA = Path(__file__).parent / "data"
TINY = DATA / "mooncake_tiny.jsonl"
REAL = Path("/work/shared/traces/mooncake-fast25/conversation_trace.jsonl")


def test_tiny_file_chains_as_worked_out_by_hand():
    assert convert_mooncake(TINY, shared_fraction=0.45) == [
        Session("mooncake-1", 0.0, (
            Round(1100, 50, 5.0),                 # line 4 at 5000 ms
            Round(1300 - 1100 - 50, 80, 4.0),     # line 7 at 9000 ms
            Round(1400 - 1300 - 80, 60, 0.0))),
        Session("mooncake-2", 0.0, (
            Round(1024, 30, 8.0),
            Round(1600 - 1024 - 30, 40, 2.0),
            Round(2100 - 1600 - 40, 70, 0.0))),
        Session("mooncake-3", 1.0, (Round(600, 20),)),
        Session("mooncake-5", 6.0, (Round(700, 25),)),
        Session("mooncake-9", 10.0, (Round(2050, 35),)),
        Session("mooncake-10", 12.0, (Round(300, 10),)),
    ]


def test_without_the_shared_rule_the_system_prompt_would_link():
    sessions = {s.session_id: s for s in convert_mooncake(TINY, shared_fraction=1.0)}
    assert "mooncake-5" not in sessions
    # line 5 now continues line 3 (and line 9, whose own parent is taken, continues
    # line 5 through block 0 alone: why shared blocks must not count)
    assert sessions["mooncake-3"].rounds[1:] == (Round(700 - 600 - 20, 25, 4.0), Round(2050 - 700 - 25, 35))


def _write(path, requests):
    """requests: (timestamp_ms, input_length, output_length, hash_ids)."""
    path.write_text("".join(
        f'{{"timestamp": {t}, "input_length": {i}, "output_length": {o}, "hash_ids": {h}}}\n'
        for t, i, o, h in requests))
    return path


def test_longest_prefix_wins_over_a_later_shorter_one(tmp_path):
    path = _write(tmp_path / "depth.jsonl", [
        (0, 1024, 10, [1, 2]),           # line 1: full blocks [1, 2]
        (1000, 512, 10, [1]),            # line 2: full blocks [1], later but shorter
        (5000, 1600, 10, [1, 2, 3, 4]),  # line 3: continues line 1
    ])
    sessions = convert_mooncake(path, shared_fraction=1.0)
    assert [(s.session_id, len(s.rounds)) for s in sessions] == [("mooncake-1", 2), ("mooncake-2", 1)]


def test_child_that_does_not_grow_the_context_gets_one_token(tmp_path):
    path = tmp_path / "retry.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1024, "output_length": 100, "hash_ids": [1, 2]}\n'
                    '{"timestamp": 3000, "input_length": 1030, "output_length": 9, "hash_ids": [1, 2, 3]}\n')
    (session,) = convert_mooncake(path, shared_fraction=1.0)
    assert session.rounds == (Round(1024, 100, 3.0), Round(1, 9, 0.0))


@pytest.mark.parametrize("name, line, field", [
    ("mooncake_bad_json.jsonl", 2, "json"),
    ("mooncake_missing_field.jsonl", 2, "hash_ids: missing"),
    ("mooncake_negative_tokens.jsonl", 3, "output_length"),
    ("mooncake_wrong_type.jsonl", 1, "input_length"),
    ("mooncake_hash_count.jsonl", 2, "hash_ids: 3 ids"),
])
def test_broken_file_names_file_line_and_field(name, line, field):
    with pytest.raises(InputError) as info:
        convert_mooncake(DATA / "broken" / name)
    assert f"{name}:{line}: {field}" in str(info.value)


def test_shipped_trace_loads_with_the_longest_chain_of_the_source_analysis():
    sessions = builtin_trace("mooncake-conversation")
    assert sum(len(s.rounds) for s in sessions) == 12031  # every request of the source file
    assert max(len(s.rounds) for s in sessions) == 43     # SOURCE.md: max 43 rounds


@pytest.mark.skipif(not REAL.exists(), reason="shared Mooncake trace not present")
def test_shipped_trace_is_what_the_converter_makes():
    assert convert_mooncake(REAL) == builtin_trace("mooncake-conversation")
