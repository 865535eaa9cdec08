"""Access control and conformance over real HTTP: a cluster (Redis, two
coordinator replicas, mock engines) whose client and admin keys come from key
files, driven the way an OpenAI client drives it."""

import asyncio

import httpx
import pytest

from ampd.config import RunConfig, override
from ampd.cluster.up import LocalCluster, free_serve_ports
from serve_rounds import kv_state, run, send_round

DECODE = [1, 2]
ALICE, BOB, ROOT = "sk-alice-0123", "sk-bob-4567", "sk-root-89ab"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("access")
    (folder / "clients").write_text(f"# one key a line\n{ALICE}\n{BOB}\n")
    (folder / "admins").write_text(f"{ROOT}\n")
    config = RunConfig(system="ampd-predictive",
                       cluster={"model": "Llama-3.1-70B", "gpu": "H20", "num_gpus": 6,
                                "deployment": "P:<TP=2,DP=1> D:<TP=2,DP=2>"},
                       workload={"name": "toolbench", "num_sessions": 5})
    config = override(config, serve={**free_serve_ports(), "time_scale": 0.5, "api_keys_file": str(folder / "clients"),
                                     "admin_keys_file": str(folder / "admins")})
    with LocalCluster(config, folder, coordinators=2) as running:
        yield running


def test_one_client_cannot_join_or_end_another_clients_session(cluster):
    """Alice's session "shared-name": Bob's round on it with session_end is 403
    on either replica and changes nothing; Alice's next round is round 1 of the
    same session, not a restart; a request without a key is 401."""
    a, b = cluster.urls

    async def go():
        async with httpx.AsyncClient(timeout=60) as client:
            first = await send_round(client, a, "shared-name", list(range(100)), 4, headers=bearer(ALICE))
            before = await kv_state(cluster.config.serve.redis_url, DECODE)
            refused = [await send_round(client, url, "shared-name", list(range(120)), 4, headers=bearer(BOB),
                                        body={"session_end": True}) for url in (a, b)]
            anonymous = await send_round(client, b, "shared-name", list(range(120)), 4)
            after = await kv_state(cluster.config.serve.redis_url, DECODE)
            second = await send_round(client, b, "shared-name", list(range(100)) + first.tokens + [7] * 10, 4,
                                      last=True, headers=bearer(ALICE))
            return first, before, refused, anonymous, after, second

    first, before, refused, anonymous, after, second = run(go())
    assert first.status == 200 and first.headers["x-ampd-round"] == "0"
    assert [r.status for r in refused] == [403, 403]
    assert all(r.error == "session shared-name belongs to another API key" for r in refused)
    assert anonymous.status == 401 and anonymous.headers["www-authenticate"] == "Bearer"
    assert after == before  # nothing reserved, nothing ended
    assert second.status == 200 and second.headers["x-ampd-round"] == "1"


def test_admin_endpoints_want_the_admin_key_and_session_ids_stay_with_admins(cluster):
    url = cluster.urls[0]
    assert httpx.get(f"{url}/ampd/decisions").status_code == 401  # admin keys are set: loopback is not enough
    assert httpx.get(f"{url}/metrics", headers=bearer(ALICE)).status_code == 403
    assert httpx.get(f"{url}/metrics", headers=bearer(ROOT)).status_code == 200
    rows = httpx.get(f"{url}/ampd/decisions", headers=bearer(ROOT), params={"kind": "bind"}).json()
    assert rows and all("session_id" in row for row in rows)
    health = httpx.get(f"{url}/health")  # open to load balancers; no session id in it
    assert health.status_code == 200 and "session" not in health.text
    assert httpx.get(f"{url}/v1/models").status_code == 401
    assert httpx.get(f"{url}/v1/models", headers=bearer(BOB)).json()["data"][0]["id"] == "Llama-3.1-70B"


def test_a_utf8_session_id_in_the_header_and_in_the_body_is_one_session(cluster):
    sid = "séance-ж-🙂"
    a, b = cluster.urls

    async def go():
        async with httpx.AsyncClient(timeout=60) as client:
            by_header = await send_round(client, a, None, list(range(50)), 3,
                                         headers={**bearer(ALICE), "X-Session-Id": sid.encode()})
            by_body = await send_round(client, b, None, list(range(50)) + by_header.tokens + [9], 3,
                                       headers=bearer(ALICE), body={"session_id": sid})
            sessions = (await kv_state(cluster.config.serve.redis_url, DECODE))[1]
            ended = await send_round(client, a, None, list(range(60)), 2, headers={
                **bearer(ALICE), "X-Session-Id": sid.encode(), "X-Session-Last-Round": "true"})
            return by_header, by_body, sessions, ended

    by_header, by_body, sessions, ended = run(go())
    assert [by_header.status, by_body.status, ended.status] == [200, 200, 200]
    assert [r.headers["x-ampd-round"] for r in (by_header, by_body, ended)] == ["0", "1", "2"]
    assert sessions[sid].num_rounds == 2


def test_chat_content_as_text_parts_is_served(cluster):
    reply = httpx.post(f"{cluster.urls[0]}/v1/chat/completions", timeout=60, headers={
        **bearer(BOB), "X-Session-Id": "chat-parts", "X-Session-Last-Round": "true"}, json={
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": "you"}]}],
        "max_tokens": 3})
    assert reply.status_code == 200 and len(reply.json()["choices"][0]["token_ids"]) == 3
    # the mock tokenizes "role: content" per line, bytes: the parts joined by a newline
    assert reply.json()["usage"]["prompt_tokens"] == len("user: hello\nyou\nassistant: ")


def test_a_body_over_the_limit_is_413_at_once_and_the_server_serves_on(cluster):
    """A valid prompt plus 20 MB of padding (the default limit is 16 MiB): 413
    naming the limit, and a request after it is served."""
    url = cluster.urls[1]
    big = b'{"prompt": [1, 2, 3], "max_tokens": 2, "pad": "' + b"x" * 20_000_000 + b'"}'
    try:
        reply = httpx.post(f"{url}/v1/completions", content=big, timeout=60,
                           headers={**bearer(BOB), "X-Session-Id": "big", "Content-Type": "application/json"})
        assert reply.status_code == 413 and "larger than 16777216 bytes" in reply.json()["error"]["message"]
    except httpx.WriteError:  # the server answered and closed before reading the rest: refused all the same
        pass
    after = httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2}, timeout=60,
                       headers={**bearer(BOB), "X-Session-Id": "after-big", "X-Session-Last-Round": "true"})
    assert after.status_code == 200


def test_an_engines_refusal_reaches_the_client_without_its_url(cluster):
    async def go():
        async with httpx.AsyncClient(timeout=60) as client:
            return await send_round(client, cluster.urls[0], "bad-token", [1, 99_999], 4, headers=bearer(BOB))
    reply = run(go())
    assert reply.status == 400 and "refused the request" in reply.error
    assert "http" not in reply.error and "127.0.0.1" not in reply.error
    assert asyncio.run(kv_state(cluster.config.serve.redis_url, DECODE))[1].get("bad-token") is None
