"""Sessions found from the prompt (``ampd.serve.state.prompt_index``) in both stores (the
in-memory one and a real Redis server), on prompts worked out by hand; block
size 16 tokens throughout."""

import asyncio

from ampd.serve.state.prompt_index import MAX_ENTRIES_PER_KEY, MAX_ENTRIES_PER_SESSION, HistoryIndex, HistoryMatch, chain_hashes, token_bytes
from ampd.serve.state.store import BOUND, SessionState

SYSTEM = list(range(1000, 1032))  # a 32-token "system prompt" (two blocks) every session shares


def run(coro):
    return asyncio.run(coro)


async def bind(store, session_id: str, worker: int = 1) -> None:
    """A binding as a first round leaves it (the index files only bound sessions)."""
    assert await store.bind_session(session_id, SessionState(worker, 0, 100, 1, 1.0), 10**9, "l", 5.0) == BOUND
    await store.close_round(session_id, "l", SessionState(worker, 100, 100, 1, 1.0), 1)


def test_a_prompt_extending_a_history_finds_its_session_at_the_right_length(make_store):
    """Session a's round: a 40-token prompt (key: its first 32 tokens), 3 output
    tokens. A token-id client resends prompt + output + new input: 43 tokens
    matched. A chat client re-renders the output (other ids): 40 matched."""
    async def go():
        store = make_store()
        index = HistoryIndex(store, 16)
        prompt, output = SYSTEM + list(range(8)), [7, 7, 7]
        assert await index.find(prompt + output + [5], "") is None  # nothing filed yet
        await bind(store, "a")
        assert await index.record("a", "", prompt, output, 0)
        by_ids = await index.find(prompt + output + [5, 6], "")
        by_text = await index.find(prompt + [9, 9, 9, 9], "")
        await store.close()
        return by_ids, by_text
    assert run(go()) == (HistoryMatch("a", 43, False, 0), HistoryMatch("a", 40, False, 0))


def test_a_shared_system_prompt_pins_no_new_session(make_store):
    """Sessions a and b share the 32-token system prompt; a new conversation
    with the same system prompt and its own first message extends neither; a
    prompt equal to a's (a new conversation saying the same) extends nothing."""
    async def go():
        store = make_store()
        index = HistoryIndex(store, 16)
        for sid, user in (("a", [1, 2, 3]), ("b", [4, 5, 6])):
            await bind(store, sid)
            await index.record(sid, "", SYSTEM + user, [8], 0)
        found = [await index.find(SYSTEM + [1, 2, 9, 9], ""), await index.find(SYSTEM + [1, 2, 3], ""),
                 await index.find(SYSTEM + [4, 5, 6, 8, 1], "")]
        await store.close()
        return found
    assert run(go()) == [None, None, HistoryMatch("b", 36, False, 0)]


def test_identical_first_prompts_are_told_apart_by_their_outputs_and_ties_go_to_the_smaller_id(make_store):
    async def go():
        store = make_store()
        index = HistoryIndex(store, 16)
        prompt = SYSTEM + [1, 2]
        for sid, output in (("b", [21, 22]), ("a", [11, 12])):
            await bind(store, sid)
            await index.record(sid, "", prompt, output, 0)
        found = [await index.find(prompt + [21, 22, 3], ""), await index.find(prompt + [11, 12, 3], ""),
                 await index.find(prompt + [99], "")]
        await store.close()
        return found
    assert run(go()) == [HistoryMatch("b", 36, False, 0), HistoryMatch("a", 36, False, 0),
                         HistoryMatch("a", 34, False, 0)]


def test_an_earlier_round_finds_a_diverged_history_and_another_key_finds_nothing(make_store):
    """Round 0: a 33-token prompt and 1 output token; round 1: 36 tokens and 1.
    A prompt that extends round 1's history is the session's latest (37 tokens);
    one that extends round 0's history (34) but not round 1's prompt (an edited
    turn) goes on from round 0, diverged; another API key finds neither."""
    async def go():
        store = make_store()
        index = HistoryIndex(store, 16)
        await bind(store, "a")
        first = SYSTEM + [1]
        await index.record("a", "key-1", first, [2], 0)
        second = first + [2, 3, 4]
        await index.record("a", "key-1", second, [5], 1)
        found = [await index.find(first + [2, 9], "key-1"), await index.find(first + [9], "key-1"),
                 await index.find(second + [5, 6], "key-1"), await index.find(second + [5, 6], "key-2")]
        await store.close()
        return found
    assert run(go()) == [HistoryMatch("a", 34, True, 0), HistoryMatch("a", 33, True, 0),
                         HistoryMatch("a", 37, False, 1), None]


def test_ties_go_to_a_sessions_latest_round_and_a_session_keeps_its_last_rounds(make_store):
    """Sessions a and b opened with the same 34-token prompt; a went on a round
    (38 tokens). b's next prompt extends both first prompts alike (34 tokens,
    re-rendered output): b's round 0 is b's latest, a's an earlier one, so b
    (without the rule, a: the smaller id). Then a runs MAX_ENTRIES_PER_SESSION
    more rounds: its first is dropped (its 35-token history no longer found), its
    second still is (39 tokens, diverged)."""
    async def go():
        store = make_store()
        index = HistoryIndex(store, 16)
        opening = SYSTEM + [1, 2]
        await bind(store, "a")
        await index.record("a", "", opening, [3], 0)
        await index.record("a", "", opening + [3, 4, 5, 6], [3], 1)
        await bind(store, "b")
        await index.record("b", "", opening, [8], 0)
        found = [await index.find(opening + [9], ""), await index.find(opening + [3, 7], "")]
        for i in range(2, MAX_ENTRIES_PER_SESSION + 1):
            await index.record("a", "", opening + [3, 4, 5, 6] * i, [3], i)
        found += [await index.find(opening + [3, 7], ""), await index.find(opening + [3, 4, 5, 6, 3, 7], "")]
        await store.close()
        return found
    assert run(go()) == [HistoryMatch("b", 34, False, 0), HistoryMatch("a", 35, True, 0),
                         HistoryMatch("b", 34, False, 0), HistoryMatch("a", 39, True, 1)]


def test_the_index_leaves_with_the_session_on_every_path(make_store):
    """A last round and idle expiry drop the binding and its entry (a session
    whose round runs is not idle); a session with no binding is not filed;
    neither is a prompt shorter than one block."""
    async def go():
        store = make_store()
        index = HistoryIndex(store, 16)
        sessions = ("ended", "idle", "running")
        for i, sid in enumerate(sessions):
            await bind(store, sid)
            assert await index.record(sid, "", SYSTEM + [i], [], 0)
        await store.close_round("ended", "l2", None, 2)  # a last round
        assert (await store.start_round("running", "", "l3", 5.0, 100, 9.0)).outcome == "started"
        expired = await store.expire_sessions(idle_before_s=1.5)
        found = [await index.find(SYSTEM + [i, 0], "") for i in range(len(sessions))]
        not_filed = [await index.record("never-bound", "", SYSTEM + [1], [], 0),
                     await index.record("running", "", list(range(15)), [4], 1)]
        left = await store.history_entries([_keys(SYSTEM)[-1].hex()])
        await store.close()
        return expired, found, not_filed, left
    expired, found, not_filed, left = run(go())
    assert expired == ["idle"]
    assert found == [None, None, HistoryMatch("running", 33, False, 0)]
    assert not_filed == [False, False]
    assert [e.session_id for e in left[0]] == ["running"]  # the one session left under the key they shared


def _keys(prompt: list[int]) -> list[bytes]:
    return chain_hashes(token_bytes(prompt), 16, "")


def test_a_key_holds_at_most_its_bound_of_sessions_dropping_the_oldest(make_store):
    async def go():
        store = make_store()
        index = HistoryIndex(store, 16)
        prompt = SYSTEM + [1]
        for i in range(MAX_ENTRIES_PER_KEY + 1):
            await bind(store, f"s{i:03d}")
            await index.record(f"s{i:03d}", "", prompt, [i], 0)
        held = (await store.history_entries([_keys(prompt)[-1].hex()]))[0]
        dropped = await index.find(prompt + [0, 5], "")  # s000's history: no longer filed
        kept = await index.find(prompt + [1, 5], "")
        await store.close()
        return held, dropped, kept
    held, dropped, kept = run(go())
    assert [e.session_id for e in held] == [f"s{i:03d}" for i in range(1, MAX_ENTRIES_PER_KEY + 1)]
    assert dropped == HistoryMatch("s001", 33, False, 0)  # only the prompt level of the oldest kept (ties: smallest id)
    assert kept == HistoryMatch("s001", 34, False, 0)


def test_a_branch_drops_the_rounds_it_left(make_store):
    """Rounds 0-2 of session a run in a line (prompts of 33, 35 and 37 tokens,
    one output token each: histories of 34, 36 and 38). Round 3 edits the turn
    after round 0: its 36-token prompt extends round 0's history only (34,
    diverged) and is filed with branch_round 0, so the decode engine holds the
    branch (41 tokens with its 5 output tokens). A prompt that goes back to
    round 2's line now shares only round 0's 34 tokens with what the engine
    holds: found at 34 from round 0, not at 38 from round 2 (dropped, with
    round 1); one that extends the branch is the latest."""
    async def go():
        store = make_store()
        index = HistoryIndex(store, 16)
        await bind(store, "a")
        line = SYSTEM + [1]
        await index.record("a", "", line, [2], 0)
        for i in (1, 2):
            line = line + [2, 3] if i == 1 else line + [4, 3]
            await index.record("a", "", line, [4], i)
        old_line = line + [4, 5]  # round 2's history and a new input
        branch = SYSTEM + [1, 2, 7, 7]
        found = [await index.find(branch, ""), await index.find(old_line, "")]
        await index.record("a", "", branch, [8] * 5, 3, branch_round=0)
        found += [await index.find(old_line, ""), await index.find(branch + [8] * 5 + [1], "")]
        await store.close()
        return found
    assert run(go()) == [HistoryMatch("a", 34, True, 0), HistoryMatch("a", 38, False, 2),
                         HistoryMatch("a", 34, True, 0), HistoryMatch("a", 41, False, 3)]
