"""KV reservations exact by construction (docs/SERVING.md, "KV reservations"),
against a real Redis, two coordinator replicas and mock engines: concurrent
rounds of one session on both replicas, rounds the engines refuse, a client
that leaves, Redis restarted empty mid-trace, and an idle TTL shorter than the
rounds. Each ends with every decode engine's reservation equal to the sum
over its sessions (read from Redis) and to the value worked out by hand, and
with the audit having repaired nothing (the totals were never wrong)."""

import asyncio
import contextlib
import random

import httpx
import pytest

from ampd.config import RunConfig, override
from ampd.serve.state.redis_store import RedisStore
from ampd.cluster.up import LocalCluster, free_serve_ports
from serve_rounds import kv_state, metric, prompt_of, run, send_round, sums_by_worker

BASE = RunConfig(system="ampd-predictive",
                 cluster={"model": "Llama-3.1-70B", "gpu": "H20", "num_gpus": 8,
                          "deployment": "P:<TP=2,DP=2> D:<TP=2,DP=2>"},
                 workload={"name": "toolbench", "num_sessions": 5})
DECODE = [2, 3]  # worker ids of the decode engines: prefill engines come first


def serving(config: RunConfig = BASE, **serve) -> RunConfig:
    return override(config, serve={**free_serve_ports(), "time_scale": 0.5, "kv_audit_interval_s": 0.5, **serve})


def audit_repairs(urls: list[str]) -> float:
    return sum(metric(httpx.get(f"{url}/metrics").text, "ampd_kv_audit_repairs_total") for url in urls)


def decisions(urls: list[str], kind: str) -> list[dict]:
    return [d for url in urls for d in httpx.get(f"{url}/ampd/decisions", params={"kind": kind,
                                                                                  "limit": 100000}).json()]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with LocalCluster(serving(), tmp_path_factory.mktemp("reservations"), coordinators=2) as running:
        yield running


def test_a_round_sent_to_both_replicas_at_once_is_served_once_and_reservations_come_back(cluster):
    """30 sessions; each one's round 2 goes to both replicas at the same moment.
    Its round lease is in Redis, so exactly one replica serves it and the other
    answers 409 whatever their timing; the round lasts seconds (120 tokens),
    so the second request always finds the first still running. After every
    session's last round each engine's reservation is its start value."""
    urls = cluster.urls
    redis_url = cluster.config.serve.redis_url
    rng = random.Random(14)
    start_totals, _ = run(kv_state(redis_url, DECODE))

    async def session(i: int, client: httpx.AsyncClient) -> list[int]:
        sid = f"pair-{i}"
        prompt = prompt_of(rng, 300 + 10 * i)
        first = await send_round(client, urls[i % 2], sid, prompt, 8)
        assert first.status == 200 and len(first.tokens) == 8
        prompt = prompt + first.tokens + prompt_of(rng, 50)
        both = await asyncio.gather(*(send_round(client, url, sid, prompt, 120) for url in urls))
        statuses = sorted(r.status for r in both)
        served = next(r for r in both if r.status == 200)
        assert len(served.tokens) == 120 and served.headers["x-ampd-round"] == "1"
        conflict = next(r for r in both if r.status == 409)
        assert "already in progress" in conflict.error and conflict.headers["retry-after"] == "1"
        last = await send_round(client, urls[(i + 1) % 2], sid, prompt + served.tokens + prompt_of(rng, 20), 4,
                                last=True)
        assert last.status == 200 and last.headers["x-ampd-round"] == "2"
        return statuses

    async def go():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(*(session(i, client) for i in range(30)))

    assert run(go()) == [[200, 409]] * 30
    totals, sessions = run(kv_state(redis_url, DECODE))
    assert sessions == {} and totals == start_totals
    assert audit_repairs(urls) == 0


def test_rounds_that_fail_give_back_what_they_took(cluster):
    """A first round the engine refuses (a token id beyond its vocabulary of
    32,000, with 90,000 tokens of output asked) leaves no binding; a later round
    refused, or left by its client mid-stream, leaves the reservation of the
    round before: prompt + max_tokens of round 1 (300 + 8), nothing more. A
    refusal is the client's error: not counted as a failed prefill."""
    urls = cluster.urls
    redis_url = cluster.config.serve.redis_url
    start_totals, _ = run(kv_state(redis_url, DECODE))
    fallbacks_before = sum(metric(httpx.get(f"{u}/metrics").text, "ampd_kv_fallbacks_total") for u in urls)

    async def go():
        async with httpx.AsyncClient(timeout=120) as client:
            refused = [await send_round(client, urls[0], f"refused-{i}", [40_000] + list(range(99)), 90_000)
                       for i in range(2)]
            first = await send_round(client, urls[1], "later", list(range(300)), 8)
            after_first = await kv_state(redis_url, DECODE)
            bad_later = await send_round(client, urls[0], "later", list(range(300)) + first.tokens + [40_000], 2000)
            after_bad = await kv_state(redis_url, DECODE)
            payload = {"prompt": list(range(300)) + first.tokens + [5] * 50, "max_tokens": 3000, "stream": True}
            async with client.stream("POST", f"{urls[1]}/v1/completions", json=payload,
                                     headers={"X-Session-Id": "later"}) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        break  # the client leaves after the first token
            while await _leased(redis_url, "later"):  # until the replica sees the client gone and closes the round
                await asyncio.sleep(0.05)
            return refused, first, after_first, bad_later, after_bad, await kv_state(redis_url, DECODE)

    refused, first, after_first, bad_later, after_bad, after_leaving = run(go())
    for reply in refused:
        assert reply.status == 400 and "prompt" in reply.error
        assert "http://" not in reply.error and "127.0.0.1" not in reply.error  # no engine URL reaches a client
    totals, sessions = after_first
    [state] = sessions.values()
    assert state.reserved_tokens == 300 + 8 and state.held_tokens == 300 + 8
    assert totals == {w: start_totals[w] + (308 if w == state.decode_worker else 0) for w in DECODE}
    assert bad_later.status == 400
    assert after_bad[0] == totals and after_bad[1]["later"].reserved_tokens == 308
    assert after_leaving[0] == totals and after_leaving[1]["later"].reserved_tokens == 308
    assert after_leaving[1]["later"].num_rounds == 3  # the round that was left did start
    fallbacks = sum(metric(httpx.get(f"{u}/metrics").text, "ampd_kv_fallbacks_total") for u in urls)
    assert fallbacks == fallbacks_before
    assert audit_repairs(urls) == 0


async def _leased(redis_url: str, session_id: str) -> bool:
    import redis.asyncio as aioredis
    client = aioredis.Redis.from_url(redis_url)
    try:
        return bool(await client.exists(f"ampd:round:{session_id}"))
    finally:
        await client.aclose()


def _expected_reserved(rounds: list[tuple[int, int]]) -> int:
    """A live session's reservation after its rounds ``(prompt tokens, max_tokens)``:
    the largest prompt + max_tokens asked so far (held tokens never exceed it)."""
    return max(p + m for p, m in rounds)


def test_redis_restarted_empty_mid_trace_gets_every_live_session_back(tmp_path):
    """20 sessions, half on each replica; Redis is killed while their second
    rounds stream and started again empty. Every round still completes; once
    both replicas have seen the new store, the bindings in Redis are exactly the
    20 live sessions with the reservations worked out from their rounds, each
    engine's total the sum over them; after the last rounds, all zero."""
    with LocalCluster(serving(), tmp_path, coordinators=2) as cluster:
        urls, redis_url = cluster.urls, cluster.config.serve.redis_url
        rng = random.Random(3)
        asked: dict[str, list[tuple[int, int]]] = {}
        prompts: dict[str, list[int]] = {}

        async def round_of(client, i: int, new_tokens: int, max_tokens: int, last: bool = False):
            sid = f"r-{i}"
            prompt = prompts.get(sid, []) + prompt_of(rng, new_tokens)
            reply = await send_round(client, urls[i % 2], sid, prompt, max_tokens, last=last)
            assert reply.status == 200 and len(reply.tokens) == max_tokens, reply.error
            asked.setdefault(sid, []).append((len(prompt), max_tokens))
            prompts[sid] = prompt + reply.tokens

        async def restart_redis_once_streaming():
            await asyncio.sleep(1.0)
            cluster.kill("redis")
            await asyncio.sleep(0.5)
            await asyncio.to_thread(cluster.restart, "redis")

        async def go():
            async with httpx.AsyncClient(timeout=120) as client:
                await asyncio.gather(*(round_of(client, i, 200 + 20 * i, 8) for i in range(20)))
                await asyncio.gather(restart_redis_once_streaming(),
                                     *(round_of(client, i, 40, 150) for i in range(20)))
                while len({d["replica"] for d in decisions(urls, "restore")}) < 2:
                    await asyncio.sleep(0.1)
                await asyncio.sleep(1.5)  # three more audits: any repair they had to make would show
                middle = await kv_state(redis_url, DECODE)
                await asyncio.gather(*(round_of(client, i, 10, 4, last=True) for i in range(20)))
                return middle, await kv_state(redis_url, DECODE)

        (totals, sessions), (end_totals, end_sessions) = run(go())
        repairs = audit_repairs(urls)
    assert sorted(sessions) == sorted(asked)
    assert {sid: s.reserved_tokens for sid, s in sessions.items()} == {
        sid: _expected_reserved(rounds[:2]) for sid, rounds in asked.items()}
    assert totals == sums_by_worker(sessions, DECODE)
    assert end_sessions == {} and end_totals == {w: 0 for w in DECODE}
    assert repairs == 0


def test_an_idle_ttl_shorter_than_the_rounds_leaves_no_drift(tmp_path):
    """Idle TTL 3 model seconds, rounds of 300 output tokens (about 8 model
    seconds each), 12 sessions of 3 rounds through both replicas: every round
    completes and, once the sessions ended, every reservation is back to 0
    (the issue's -89,880 came from a session expired mid-round and ended again
    by its last round)."""
    with LocalCluster(serving(session_idle_ttl_s=3.0), tmp_path, coordinators=2) as cluster:
        urls, redis_url = cluster.urls, cluster.config.serve.redis_url
        rng = random.Random(5)

        async def session(client, i: int) -> None:
            prompt = []
            for r in range(3):
                prompt = prompt + prompt_of(rng, 100)
                reply = await send_round(client, urls[(i + r) % 2], f"ttl-{i}", prompt, 300, last=r == 2)
                assert reply.status == 200 and len(reply.tokens) == 300, reply.error
                prompt = prompt + reply.tokens

        async def go():
            async with httpx.AsyncClient(timeout=120) as client:
                await asyncio.gather(*(session(client, i) for i in range(12)))

        run(go())
        totals, sessions = run(kv_state(redis_url, DECODE))
        repairs = audit_repairs(urls)
    assert sessions == {} and totals == {w: 0 for w in DECODE}
    assert repairs == 0


def test_idle_expiry_spares_every_session_whose_round_is_running(cluster):
    """Six sessions stream a long round; an expiry run as any replica runs it,
    with every session counted idle, ends none of them (their rounds hold
    leases); once the rounds are done the same expiry ends all six and the
    reservations are back to their start values."""
    urls, redis_url = cluster.urls, cluster.config.serve.redis_url
    far_future_s = 1e12  # model seconds: every session is idle since before it

    async def go():
        store = RedisStore(redis_url)
        await store.expire_sessions(far_future_s)  # what earlier tests left bound
        start_totals = (await kv_state(redis_url, DECODE))[0]
        async with httpx.AsyncClient(timeout=120) as client:
            for i in range(6):
                assert (await send_round(client, urls[i % 2], f"busy-{i}", list(range(200 + i)), 4)).status == 200
            async with contextlib.AsyncExitStack() as streams:
                lines = []
                for i in range(6):
                    response = await streams.enter_async_context(client.stream(
                        "POST", f"{urls[i % 2]}/v1/completions", headers={"X-Session-Id": f"busy-{i}"},
                        json={"prompt": list(range(300 + i)), "max_tokens": 400, "stream": True}))
                    lines.append(response.aiter_lines())
                    while not (await anext(lines[-1])).startswith("data: {"):
                        pass  # the round's first token: its lease is held
                during = await store.expire_sessions(far_future_s)
                for reader in lines:
                    async for _ in reader:
                        pass
        after = await store.expire_sessions(far_future_s)
        await store.close()
        return start_totals, during, after, await kv_state(redis_url, DECODE)

    start_totals, during, after, (totals, sessions) = run(go())
    assert during == [] and sorted(after) == [f"busy-{i}" for i in range(6)]
    assert sessions == {} and totals == start_totals
