"""A client sends a session's next round the moment it reads the end of the
previous one (``data: [DONE]``, or the end of a non-streaming body), as an
agent does: that round is never refused as "already in progress" (409): the
previous round's lease is given back before its client can see it end.

The coordinator runs in this process, over a real Redis and mock engines, with
its lease renewals back to back instead of once a second, each reaching Redis a
few event-loop turns late (``renew_late``): a renewal is then in flight whenever
a round ends, the moment that once let a renewal take a lease back after the
round had released it (docs/SERVING.md, "KV reservations"); without the fix most
sessions met a 409."""

import asyncio
import contextlib
import random

import httpx
import pytest
import uvicorn

from ampd.config import RunConfig, override
from ampd.serve.rounds import sessions
from ampd.serve.build import build_app
from ampd.serve.state.redis_store import RedisStore
from ampd.serve.state.store import StoreUnavailable
from ampd.cluster.up import LocalCluster, free_port_block, free_serve_ports
from serve_rounds import Reply, kv_state, metric, prompt_of, send_round

CONFIG = RunConfig(system="ampd-predictive",
                   cluster={"model": "Llama-3.1-70B", "gpu": "H20", "num_gpus": 8,
                            "deployment": "P:<TP=2,DP=2> D:<TP=2,DP=2>"},
                   workload={"name": "toolbench", "num_sessions": 5})
DECODE = [2, 3]  # worker ids of the decode engines: prefill engines come first
SESSIONS, ROUNDS = 16, 8


_renew_leases, _close_round = RedisStore.renew_leases, RedisStore.close_round


async def renew_late(self: RedisStore, leases: dict[str, str], lease_ttl_s: float) -> list[str]:
    """A renewal that reaches Redis after what else was ready to run, as one does
    that must open a connection first (its client's pool had none idle)."""
    for _ in range(3):
        await asyncio.sleep(0)
    return await _renew_leases(self, leases, lease_ttl_s)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """Redis and mock engines; no coordinator (each test runs its own, here)."""
    config = override(CONFIG, serve={**free_serve_ports(coordinators=0), "time_scale": 0.1, "kv_audit_interval_s": 0.5})
    with LocalCluster(config, tmp_path_factory.mktemp("next-round"), coordinators=0) as cluster:
        yield cluster.config


@contextlib.asynccontextmanager
async def coordinator(config: RunConfig, replica_id: str):
    """A coordinator replica served over HTTP from this event loop; its URL."""
    port = free_port_block(1)
    server = uvicorn.Server(uvicorn.Config(build_app(config, replica_id), host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()  # raises why it stopped
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def send_whole(client: httpx.AsyncClient, url: str, session_id: str, prompt: list[int], max_tokens: int,
                     last: bool = False) -> Reply:
    """POST one non-streaming round and read its whole body."""
    headers = {"X-Session-Id": session_id, **({"X-Session-Last-Round": "true"} if last else {})}
    response = await client.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens},
                                 headers=headers)
    if response.status_code != 200:
        return Reply(response.status_code, headers=dict(response.headers), error=response.json()["error"]["message"])
    return Reply(200, response.json()["choices"][0]["token_ids"], dict(response.headers))


@pytest.mark.parametrize("stream", [True, False], ids=["streaming", "non-streaming"])
def test_the_next_round_sent_at_the_end_of_the_last_one_is_served(engines, monkeypatch, stream):
    """16 sessions of 8 rounds each, every round sent the instant the one before
    ended, long first prompts and alternately short and long new inputs (so the
    router places rounds both locally and remotely): every round is served (200)
    with all its tokens; afterwards no binding is left, every decode engine's
    reservation is back where it started and the audit repaired nothing."""
    monkeypatch.setattr(sessions, "ROUND_LEASE_RENEW_S", 0.0)
    monkeypatch.setattr(RedisStore, "renew_leases", renew_late)
    send = send_round if stream else send_whole
    replica = f"next-round-{'stream' if stream else 'whole'}"
    rng = random.Random(7)

    async def session(client: httpx.AsyncClient, url: str, i: int) -> list[Reply]:
        prompt, replies = [], []
        for r in range(ROUNDS):
            prompt = prompt + prompt_of(rng, 1500 if r == 0 else (30 if r % 2 else 600))
            reply = await send(client, url, f"{replica}-{i}", prompt, 4 + (i + r) % 5, last=r == ROUNDS - 1)
            replies.append(reply)
            if reply.status != 200:
                break
            prompt = prompt + reply.tokens
        return replies

    async def go():
        start = await kv_state(engines.serve.redis_url, DECODE)
        async with coordinator(engines, replica) as url, httpx.AsyncClient(timeout=120) as client:
            replies = await asyncio.gather(*(session(client, url, i) for i in range(SESSIONS)))
            repairs = metric((await client.get(f"{url}/metrics")).text, "ampd_kv_audit_repairs_total")
        return start, replies, repairs, await kv_state(engines.serve.redis_url, DECODE)

    (start_totals, _), replies, repairs, (totals, bindings) = asyncio.run(go())
    failed = [(i, r, reply.status, reply.error) for i, rounds in enumerate(replies)
              for r, reply in enumerate(rounds) if reply.status != 200]
    assert failed == []
    for i, rounds in enumerate(replies):
        assert [len(reply.tokens) for reply in rounds] == [4 + (i + r) % 5 for r in range(ROUNDS)]
    placements = {reply.headers["x-ampd-local"] for rounds in replies for reply in rounds}
    assert placements == {"true", "false"}  # local and remote rounds both met
    assert {sid for sid in bindings if sid.startswith(replica)} == set()
    assert totals == start_totals and repairs == 0


def test_a_round_end_the_store_did_not_take_is_written_before_the_next_round(engines, monkeypatch):
    """The store does not answer the end of each session's first round (both
    tries): the client still gets every token, and its next round, sent the
    instant the first ended, writes that end first and is served; at the end
    no binding is left and the reservations are back where they started."""
    monkeypatch.setattr(sessions, "ROUND_LEASE_RENEW_S", 3600.0)  # the renewal loop never writes it meanwhile
    unanswered: dict[str, int] = {}

    async def close_round(self, session_id, lease, state, num_rounds):
        if num_rounds == 1 and unanswered.get(session_id, 0) < 2:
            unanswered[session_id] = unanswered.get(session_id, 0) + 1
            raise StoreUnavailable("no answer (test)")
        return await _close_round(self, session_id, lease, state, num_rounds)

    monkeypatch.setattr(RedisStore, "close_round", close_round)
    rng = random.Random(11)

    async def session(client: httpx.AsyncClient, url: str, i: int) -> list[Reply]:
        prompt, replies = [], []
        for r in range(3):
            prompt = prompt + prompt_of(rng, 400)
            replies.append(await send_round(client, url, f"unanswered-{i}", prompt, 6, last=r == 2))
            prompt = prompt + replies[-1].tokens
        return replies

    async def go():
        start = await kv_state(engines.serve.redis_url, DECODE)
        async with coordinator(engines, "unanswered") as url, httpx.AsyncClient(timeout=120) as client:
            replies = await asyncio.gather(*(session(client, url, i) for i in range(4)))
        return start, replies, await kv_state(engines.serve.redis_url, DECODE)

    (start_totals, _), replies, (totals, bindings) = asyncio.run(go())
    assert unanswered == {f"unanswered-{i}": 2 for i in range(4)}
    assert [[(reply.status, len(reply.tokens)) for reply in rounds] for rounds in replies] == [[(200, 6)] * 3] * 4
    assert {sid for sid in bindings if sid.startswith("unanswered")} == set() and totals == start_totals
