"""Helpers of the serving tests that drive a real cluster round by round: send
one round and read it to its end, read every engine's KV reservation and every
binding from Redis."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import httpx

from ampd.serve.state.redis_store import RedisStore
from ampd.serve.state.store import SessionState


@dataclass
class Reply:
    """One round as the client saw it."""

    status: int
    tokens: list[int] = field(default_factory=list)
    headers: dict[str, str] = field(default_factory=dict)
    error: str = ""


async def send_round(client: httpx.AsyncClient, url: str, session_id: str | None, prompt: list[int],
                     max_tokens: int, last: bool = False, headers: dict | None = None, body: dict | None = None) -> Reply:
    """POST one streaming round (``session_id`` in the header unless None; more
    fields in ``body``) and read it to ``[DONE]``; an error chunk after HTTP 200
    is reported as its code."""
    headers = {**({"X-Session-Id": session_id} if session_id is not None else {}), **(headers or {})}
    if last:
        headers["X-Session-Last-Round"] = "true"
    payload = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, **(body or {})}
    async with client.stream("POST", f"{url}/v1/completions", json=payload, headers=headers) as response:
        if response.status_code != 200:
            await response.aread()
            return Reply(response.status_code, headers=dict(response.headers),
                         error=response.json()["error"]["message"])
        reply = Reply(200, headers=dict(response.headers))
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                event = httpx.Response(200, content=line[6:]).json()
                if "error" in event:
                    return Reply(event["error"]["code"], reply.tokens, reply.headers, event["error"]["message"])
                reply.tokens += event["choices"][0]["token_ids"] if event["choices"] else []
    return reply


def prompt_of(rng: random.Random, num_tokens: int) -> list[int]:
    return [rng.randrange(32_000) for _ in range(num_tokens)]


async def kv_state(redis_url: str, decode_ids: list[int]) -> tuple[dict[int, int], dict[str, SessionState]]:
    """Every decode engine's reserved KV total and every binding, read from Redis."""
    store = RedisStore(redis_url)
    try:
        states = await store.snapshot(decode_ids, 0.0)
        return {s.worker_id: s.kv_used_tokens for s in states}, await store.sessions()
    finally:
        await store.close()


def sums_by_worker(sessions: dict[str, SessionState], decode_ids: list[int]) -> dict[int, int]:
    """The invariant's right-hand side: per decode worker, the sum of its sessions' reservations."""
    sums = dict.fromkeys(decode_ids, 0)
    for state in sessions.values():
        sums[state.decode_worker] += state.reserved_tokens
    return sums


def metric(text: str, name: str) -> float:
    """The sum of a Prometheus metric's samples (every label set) in an exposition."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#") and line[len(name)] in " {")


def run(coro):
    return asyncio.run(coro)
