"""Unmodified OpenAI clients: the ``openai`` SDK drives multi-turn chat and
completions, streaming and not, through two coordinator replicas on Redis and
mock engines, sending no ampd header; sessions are found from the prompt, from
``prompt_cache_key`` or from a configured header (docs/SERVING.md, "How
sessions are found")."""

import asyncio
import collections
import json
import time
from dataclasses import dataclass, field

import httpx
import openai
import pytest

from ampd.config import RunConfig, override
from ampd.cluster.up import LocalCluster, free_serve_ports

MODEL = "Llama-3.1-70B"
DECODE = [1, 2, 3]
CONVERSATIONS, TURNS, MAX_TOKENS = 20, 3, 4
HELD_TOKENS = 2000  # a turn long enough to be running while another is sent (about 10 wall seconds)
# The mock engine tokenizes a chat as "<role>: <content>\n" lines, one token a byte: this
# system line is 1,000 tokens ("system: " + 991 characters + "\n").
SYSTEM = ("You are a careful assistant. " * 40)[:991]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    config = RunConfig(system="ampd-predictive",
                       cluster={"model": MODEL, "gpu": "H20", "num_gpus": 8,
                                "deployment": "P:<TP=2,DP=1> D:<TP=2,DP=3>"},
                       workload={"name": "toolbench", "num_sessions": 5})
    config = override(config, serve={**free_serve_ports(), "time_scale": 0.25,
                                     "session_headers": ["X-Correlation-ID"],
                                     "served_model_aliases": ["agent-model"]})
    with LocalCluster(config, tmp_path_factory.mktemp("openai"), coordinators=2) as running:
        yield running


def clients(cluster) -> list[openai.AsyncOpenAI]:
    """One SDK client per coordinator replica, retries off (a failed turn must show)."""
    return [openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
            for url in cluster.urls]


@dataclass
class Turn:
    """One turn as the client saw it."""

    session_id: str
    decode_worker: int
    round_index: int
    prompt_tokens: int
    cached_tokens: int
    text: str


@dataclass
class Conversation:
    turns: list[Turn] = field(default_factory=list)


async def chat_turn(client: openai.AsyncOpenAI, messages: list[dict], stream: bool, **extra) -> Turn:
    """One chat turn through the SDK, its headers and usage read back."""
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=MAX_TOKENS, stream=stream,
        **({"stream_options": {"include_usage": True}} if stream else {}), **extra)
    reply = raw.parse()  # the raw response of `with_raw_response` parses at once
    if stream:
        parts, usage = [], None
        async for chunk in reply:
            parts += [c.delta.content for c in chunk.choices if c.delta.content]
            usage = chunk.usage or usage
        text = "".join(parts)
    else:
        text, usage = reply.choices[0].message.content, reply.usage
    assert usage.completion_tokens == MAX_TOKENS
    return Turn(raw.headers["x-ampd-session-id"], int(raw.headers["x-ampd-decode-worker"]),
                int(raw.headers["x-ampd-round"]), usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens, text)


async def converse(sdk: list[openai.AsyncOpenAI], index: int, key: str | None) -> Conversation:
    """Conversation ``index``: TURNS turns of a growing history, alternately
    through each replica; even conversations stream. ``key``: how the client
    names its session (None: it does not)."""
    extra = {"prompt_cache_key": f"cache-{index}"} if key == "prompt_cache_key" else \
        {"extra_headers": {"X-Correlation-ID": f"corr-{index}"}} if key == "header" else {}
    messages = [{"role": "system", "content": SYSTEM}]
    conversation = Conversation()
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"{index:02d}/{turn}: what next for case {index}?"})
        done = await chat_turn(sdk[(index + turn) % len(sdk)], messages, index % 2 == 0, **extra)
        messages.append({"role": "assistant", "content": done.text})
        conversation.turns.append(done)
    return conversation


def run_conversations(cluster, key: str | None) -> list[Conversation]:
    async def go():
        sdk = clients(cluster)
        try:
            return await asyncio.gather(*(converse(sdk, i, key) for i in range(CONVERSATIONS)))
        finally:
            for client in sdk:
                await client.close()
    return asyncio.run(go())


def decisions(cluster, kind: str) -> list[dict]:
    return [d for url in cluster.urls
            for d in httpx.get(f"{url}/ampd/decisions", params={"kind": kind, "limit": 100000}).json()]


def check_placement(conversations: list[Conversation]) -> None:
    """>= 95 % of later turns on the decode engine holding their history, in
    their session, nothing lost; the conversations per decode engine."""
    later = [(c.turns[0], t) for c in conversations for t in c.turns[1:]]
    assert len(later) == CONVERSATIONS * (TURNS - 1)  # every turn answered, none lost
    at_home = sum(t.session_id == first.session_id and t.decode_worker == first.decode_worker for first, t in later)
    assert at_home >= 0.95 * len(later)
    assert len({c.turns[0].session_id for c in conversations}) == CONVERSATIONS
    per_engine = collections.Counter(c.turns[0].decode_worker for c in conversations)
    print(f"turns on their history's engine: {at_home}/{len(later)}; conversations per decode engine: "
          f"{dict(sorted(per_engine.items()))}")
    assert max(per_engine.values()) <= 2 * CONVERSATIONS / len(DECODE)  # at most twice the fair share


def test_twenty_conversations_sharing_a_system_prompt_are_found_without_a_session_key(cluster):
    """The SDK sends no session key: each conversation's first turn starts a
    session bound by free KV (the shared 1,000-token system prompt pins none),
    and every later turn, on either replica, is found from its prompt: the same
    session on the same decode engine, its previous prompt and reply matched
    exactly (the mock's chat reply renders back to the ids it generated,
    docs/SERVING.md "Chat and agents": the history-level match) and not
    recomputed."""
    binds_before = len(decisions(cluster, "bind"))
    conversations = run_conversations(cluster, None)
    check_placement(conversations)
    for c in conversations:
        assert [t.round_index for t in c.turns] == list(range(TURNS))
        assert c.turns[0].prompt_tokens > 1000 and c.turns[0].cached_tokens == 0
        for before, turn in zip(c.turns, c.turns[1:]):
            assert turn.cached_tokens == before.prompt_tokens + MAX_TOKENS
    assert len(decisions(cluster, "bind")) - binds_before == CONVERSATIONS  # one binding per conversation
    found = {(d["session_id"], d["prompt_tokens"]): d["matched_tokens"] for d in decisions(cluster, "infer")}
    for c in conversations:
        assert found[(c.turns[0].session_id, c.turns[0].prompt_tokens)] == 0  # a new session
        for before, turn in zip(c.turns, c.turns[1:]):
            assert found[(turn.session_id, turn.prompt_tokens)] == before.prompt_tokens + MAX_TOKENS


@pytest.mark.parametrize("key", ["prompt_cache_key", "header"])
def test_conversations_naming_their_session_by_prompt_cache_key_or_a_configured_header(cluster, key):
    conversations = run_conversations(cluster, key)
    check_placement(conversations)
    names = [c.turns[0].session_id for c in conversations]
    assert names == [f"{'cache' if key == 'prompt_cache_key' else 'corr'}-{i}" for i in range(CONVERSATIONS)]
    inferred = {d["session_id"] for d in decisions(cluster, "infer")}
    assert not inferred & set(names)  # named sessions are never looked up


def test_conversations_with_identical_first_turns_go_on_in_their_own_sessions(cluster):
    """Two first turns with the same prompt: two new sessions (a prompt equal to
    a history does not extend it), x and y, x the smaller id. Each second turn
    extends that prompt, which both entries hold (a tie: x). x's conversation's
    second turn is kept open (streaming, unread) while y's is sent: x is busy,
    so y's goes on in a new session, not a 409. A third conversation's second
    turn afterwards finds y, the one session still holding that prompt. (x's
    turn is long, HELD_TOKENS tokens, some seconds of decoding: the engine
    decodes on whether or not the client reads, and a short turn would be over
    before y's is sent.)"""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "the very same question"}]

    def next_turn(turn: Turn) -> list[dict]:
        return messages + [{"role": "assistant", "content": turn.text}, {"role": "user", "content": "go on"}]

    async def go():
        sdk = clients(cluster)
        firsts = sorted([await chat_turn(sdk[0], messages, False), await chat_turn(sdk[1], messages, False)],
                        key=lambda t: t.session_id)
        held = await sdk[0].chat.completions.with_raw_response.create(
            model=MODEL, messages=next_turn(firsts[0]), max_tokens=HELD_TOKENS, stream=True)
        other = await chat_turn(sdk[1], next_turn(firsts[1]), False)
        async for _ in held.parse():  # x's turn ends only now
            pass
        third = await chat_turn(sdk[1], next_turn(firsts[1]), False)
        for client in sdk:
            await client.close()
        return firsts, held.headers["x-ampd-session-id"], other, third
    (x, y), held_session, other, third = asyncio.run(go())
    assert x.session_id != y.session_id and (x.round_index, y.round_index) == (0, 0)
    assert held_session == x.session_id
    assert other.session_id not in (x.session_id, y.session_id) and other.round_index == 0
    assert {"session_id": other.session_id, "busy": x.session_id}.items() <= next(
        d for d in decisions(cluster, "infer") if d.get("busy")).items()
    assert (third.session_id, third.round_index) == (y.session_id, 1)


def test_completions_text_and_token_ids_streaming_or_not_find_their_session(cluster):
    """Completions through the SDK: a text prompt grown by the reply's text, and
    a token-id prompt grown by the reply's ids (the history-level match: prompt
    and output, 1,000 + 4 tokens, then 1,010 + 4 + 3)."""
    async def go():
        sdk = clients(cluster)[0]
        rows = []
        for stream in (False, True):
            text = SYSTEM + f" text completion, stream={stream}:"
            ids = list(range(5, 1005))
            for turn in range(TURNS):
                for prompt in (text, ids):
                    raw = await sdk.completions.with_raw_response.create(
                        model="agent-model", prompt=prompt, max_tokens=MAX_TOKENS, stream=stream,
                        **({"stream_options": {"include_usage": True}} if stream else {}))
                    reply = raw.parse()  # the raw response of `with_raw_response` parses at once
                    if stream:
                        chunks = [chunk async for chunk in reply]
                        out, usage = "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage
                        out_ids = [t for c in chunks if c.choices for t in c.choices[0].model_extra["token_ids"]]
                    else:
                        out, usage = reply.choices[0].text, reply.usage
                        out_ids = reply.choices[0].model_extra["token_ids"]
                    rows.append((stream, isinstance(prompt, str), turn, raw.headers["x-ampd-session-id"],
                                 raw.headers["x-ampd-decode-worker"], usage.prompt_tokens,
                                 usage.prompt_tokens_details.cached_tokens))
                    if isinstance(prompt, str):
                        text = prompt + out + f" next {turn}"
                    else:
                        ids = prompt + out_ids + [7, 8, 9]
        await sdk.close()
        return rows
    rows = asyncio.run(go())
    by_run = collections.defaultdict(list)
    for stream, is_text, turn, session_id, decode_worker, prompt_tokens, cached in rows:
        by_run[stream, is_text].append((session_id, decode_worker, prompt_tokens, cached))
    for (stream, is_text), turns in by_run.items():
        assert len({(s, w) for s, w, _, _ in turns}) == 1, (stream, is_text)  # one session, one engine
        if not is_text:
            assert [(p, c) for _, _, p, c in turns] == [(1000, 0), (1007, 1004), (1014, 1011)]


def test_tools_and_tool_messages_pass_and_an_unknown_model_is_openais_404(cluster):
    call = {"id": "call-1", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"q": "x"})}}
    tools = [{"type": "function", "function": {"name": "lookup", "description": "look a word up",
                                               "parameters": {"type": "object",
                                                              "properties": {"q": {"type": "string"}}}}}]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "tools, please"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call-1", "content": "x means y"}]

    async def go():
        sdk = clients(cluster)[1]
        reply = await sdk.chat.completions.create(model=MODEL, messages=messages, tools=tools, tool_choice="auto",
                                                  max_tokens=MAX_TOKENS)
        with pytest.raises(openai.NotFoundError) as missing:
            await sdk.chat.completions.create(model="gpt-4o", messages=messages[:2], max_tokens=MAX_TOKENS)
        listed = [m.id for m in (await sdk.models.list()).data]
        await sdk.close()
        return reply, missing.value, listed
    reply, missing, listed = asyncio.run(go())
    assert reply.usage.completion_tokens == MAX_TOKENS and reply.choices[0].message.content
    assert missing.status_code == 404 and missing.code == "model_not_found" and missing.type == "invalid_request_error"
    assert listed == [MODEL, "agent-model"]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_client_that_leaves_mid_round_frees_its_session(cluster, path, stream):
    """A client that leaves a long round (a stream closed after a few chunks; a
    non-streaming request that times out after 1 s of a round of about 10 s):
    the round is given back, counted once as a disconnect on the replica, and
    the session's next round on the same replica is served (it was 409 while
    the replica still counted the round as running: for good after a stream,
    until the last token without one). A 409 is retried for up to 30 s: the
    replica learns of a stream's disconnect only when it next writes to the
    closed connection."""
    url, session = cluster.urls[0], f"leaves-{path.rsplit('/', 1)[-1]}-{stream}"
    body = ({"messages": [{"role": "user", "content": "tell me more"}]} if "chat" in path
            else {"prompt": list(range(5, 105))})
    left_before = _disconnects(url)
    long_round = {**body, "max_tokens": HELD_TOKENS, "stream": stream}
    if stream:
        with httpx.stream("POST", f"{url}{path}", json=long_round, headers={"X-Session-Id": session},
                          timeout=60) as reply:
            assert reply.status_code == 200
            for i, _ in enumerate(reply.iter_lines()):
                if i == 5:
                    break
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}{path}", json=long_round, headers={"X-Session-Id": session}, timeout=1.0)
    for _ in range(60):
        again = httpx.post(f"{url}{path}", json={**body, "max_tokens": MAX_TOKENS},
                           headers={"X-Session-Id": session}, timeout=60)
        if again.status_code != 409:
            break
        time.sleep(0.5)
    assert again.status_code == 200, again.text
    assert _disconnects(url) - left_before == 1


def _disconnects(url: str) -> float:
    """Rounds a replica counted as ended by a client that left."""
    sample = 'ampd_round_failures_total{cause="disconnect"}'
    lines = [line for line in httpx.get(f"{url}/metrics").text.splitlines() if line.startswith(sample)]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0


@pytest.mark.parametrize("named", [False, True], ids=["found", "named"])
def test_an_edited_earlier_turn_goes_on_in_its_session_from_the_common_prefix(cluster, named):
    """Three turns, then the second user turn edited (the client rewrites it and
    asks again): the prompt extends turn 0's history (its prompt and the 4 ids
    generated, re-rendered exactly) but not turn 1's prompt, so it goes on in
    the same session as round 3 from turn 0's history (``infer``: diverged),
    and so does a session the client names (``X-Session-Id``; ``history``:
    diverged), whose decode engine holds turn 2's prompt and output.
    What the engine reuses: on the decode engine (a local prefill), the longest
    common prefix with the ids it holds (turn 2's prompt and output), worked out
    by hand in the mock's one-token-a-byte chat: turn 0's history, "\\nuser: "
    (7) and the edited turn's common start "edit-case: about " (17); on a prefill
    engine, the history the coordinator verified (turn 0's)."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "edit-case: where to?"}]
    extra = {"extra_headers": {"X-Session-Id": f"edit-named-{time.time_ns()}"}} if named else {}

    async def go():
        sdk = clients(cluster)
        history, turns = list(messages), []
        for user in ("edit-case: about Rome", "edit-case: and then?"):
            turns.append(await chat_turn(sdk[0], history, False, **extra))
            history += [{"role": "assistant", "content": turns[-1].text}, {"role": "user", "content": user}]
        turns.append(await chat_turn(sdk[1], history, False, **extra))
        edited = history[:3] + [{"role": "user", "content": "edit-case: about Paris"}]
        turns.append(await chat_turn(sdk[1], edited, False, **extra))
        for client in sdk:
            await client.close()
        return turns
    first, _, _, edit = asyncio.run(go())
    assert (edit.session_id, edit.round_index) == (first.session_id, 3)
    verified = first.prompt_tokens + MAX_TOKENS
    [inferred] = [d for d in decisions(cluster, "history" if named else "infer")
                  if d["session_id"] == edit.session_id and d["prompt_tokens"] == edit.prompt_tokens]
    assert (inferred["matched_tokens"], inferred["diverged"]) == (verified, True)
    [route] = [d for d in decisions(cluster, "route") if d["session_id"] == edit.session_id and
               d["round_index"] == 3]
    assert edit.cached_tokens == (verified + 7 + 17 if route["local"] else verified)
