"""The profiler's side of one OpenAI-compatible engine: completions on token prompts,
unique prompts, the engine's identity.

Prompts are token ids, so a probe knows its lengths exactly (no tokenizer between).
Every request carries ``X-Session-Id``: vLLM ignores it; a mock engine keys its prefix
cache by it (``ampd.engines.mock.server``).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from ampd.profile.scrape import CACHE_CONFIG, ProbeError, scrape

# [our choice] Prompt ids drawn from [100, 1000): inside any real vocabulary, clear of
# the special ids real tokenizers put first, and far from EOS (probes also set ignore_eos).
_LOW_ID, _HIGH_ID = 100, 1000


@dataclass
class ProbedEngine:
    """One engine under measurement.

    Attributes:
        url: base URL, e.g. ``http://127.0.0.1:8101``.
        model: the served model id (``/v1/models``).
        client: the HTTP client every probe uses.
        rng: draws unique prompts (seeded by the caller: a profile repeats exactly).
        request_timeout_s: how long one request may take before the probe fails.
        finished_requests: requests through this handle that the engine finished (each
            adds one observation to its per-request histograms).
    """

    url: str
    model: str
    client: httpx.AsyncClient
    rng: np.random.Generator
    request_timeout_s: float = 300.0
    finished_requests: int = 0
    _sessions: int = field(default=0, repr=False)

    def unique_prompt(self, num_tokens: int) -> list[int]:
        """``num_tokens`` random ids: a prefix no earlier probe shares (2^-30 odds of
        two 10-token prefixes meeting)."""
        return [int(t) for t in self.rng.integers(_LOW_ID, _HIGH_ID, num_tokens)]

    def new_session(self) -> str:
        """A session id no other probe of this engine uses."""
        self._sessions += 1
        return f"ampd-profile-{self._sessions}"

    def _body(self, prompt: list[int], max_tokens: int, stream: bool,
              kv_transfer_params: dict[str, Any] | None) -> dict[str, Any]:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": stream, "return_token_ids": True}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if kv_transfer_params is not None:
            body["kv_transfer_params"] = kv_transfer_params
        return body

    async def complete(self, prompt: list[int], max_tokens: int, session: str,
                       kv_transfer_params: dict[str, Any] | None = None) -> dict[str, Any]:
        """A non-streaming completion; the reply's JSON.

        Raises:
            ProbeError: an HTTP error or an error reply (its body quoted).
        """
        try:
            reply = await self.client.post(f"{self.url}/v1/completions", headers={"X-Session-Id": session},
                                           json=self._body(prompt, max_tokens, False, kv_transfer_params),
                                           timeout=self.request_timeout_s)
        except httpx.TimeoutException:
            raise ProbeError(f"{self.url}/v1/completions: no reply within {self.request_timeout_s:g} s: the engine "
                             f"stalled or stopped answering") from None
        except httpx.HTTPError as exc:
            raise ProbeError(f"{self.url}/v1/completions: {exc!r}") from None
        if reply.status_code != 200:
            raise ProbeError(f"{self.url}/v1/completions: HTTP {reply.status_code}: {reply.text[:300]}")
        self.finished_requests += 1
        return reply.json()

    async def stream(self, prompt: list[int], max_tokens: int, session: str, reached: asyncio.Event | None = None,
                     reach_tokens: int = 0) -> int:
        """Stream a completion to its end; the number of tokens it carried. Sets
        ``reached`` once ``reach_tokens`` have arrived.

        Raises:
            ProbeError: an HTTP error, an error reply, or fewer tokens than asked.
        """
        received = 0
        try:
            async with self.client.stream("POST", f"{self.url}/v1/completions", headers={"X-Session-Id": session},
                                          json=self._body(prompt, max_tokens, True, None),
                                          timeout=self.request_timeout_s) as reply:
                if reply.status_code != 200:
                    raise ProbeError(f"{self.url}/v1/completions: HTTP {reply.status_code}: "
                                     f"{(await reply.aread())[:300]!r}")
                async for line in reply.aiter_lines():
                    received += _chunk_tokens(line)
                    if reached is not None and received >= reach_tokens:
                        reached.set()
        except httpx.TimeoutException:
            raise ProbeError(f"{self.url}/v1/completions (stream): no token within {self.request_timeout_s:g} s: the "
                             f"engine stalled or stopped answering") from None
        except httpx.HTTPError as exc:
            raise ProbeError(f"{self.url}/v1/completions (stream): {exc!r}") from None
        if received < max_tokens:
            raise ProbeError(f"{self.url}: a stream of {max_tokens} tokens ended after {received}")
        self.finished_requests += 1
        return received

def _chunk_tokens(line: str) -> int:
    """Output tokens in one server-sent event line (vLLM merges several into one chunk
    for a client that reads late): its choices' ``token_ids``, one per choice where
    the engine returns no ids; 0 for the usage chunk, ``[DONE]`` and blank lines."""
    if not line.startswith("data: {"):
        return 0
    choices = json.loads(line[6:]).get("choices") or []
    return sum(len(c["token_ids"]) if c.get("token_ids") is not None else 1 for c in choices)


def cached_tokens(reply: dict[str, Any], url: str) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` of a completion reply.

    Raises:
        ProbeError: the engine does not report it (vLLM needs
            ``--enable-prompt-tokens-details``).
    """
    details = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
    if not isinstance(details.get("cached_tokens"), int):
        raise ProbeError(f"{url}: the reply has no usage.prompt_tokens_details.cached_tokens: start vLLM with "
                         "--enable-prompt-tokens-details so the profiler can check its prefix-cache hits")
    return details["cached_tokens"]


async def connect(url: str, client: httpx.AsyncClient, rng: np.random.Generator) -> tuple[ProbedEngine, dict]:
    """The engine at ``url`` and its fingerprint: served model, its ``max_model_len``,
    engine version (vLLM's ``/version``; ``"ampd-mock"`` for a mock), KV block size and
    capacity (vLLM's ``cache_config_info``).

    Raises:
        ProbeError: unreachable, no model served, or no ``/metrics``.
    """
    try:
        models = (await client.get(f"{url}/v1/models")).json()["data"]
        version = await client.get(f"{url}/version")
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise ProbeError(f"{url}/v1/models: not an OpenAI-compatible engine: {exc!r}") from None
    if not models:
        raise ProbeError(f"{url}/v1/models: serves no model")
    served = models[0]
    cache = (await scrape(client, url)).labels.get(CACHE_CONFIG, {})
    fingerprint = {
        "url": url, "model": served.get("id"), "max_model_len": served.get("max_model_len"),
        "engine": "ampd-mock" if served.get("owned_by") == "ampd-mock" else "vllm",
        "engine_version": version.json().get("version") if version.status_code == 200 else None,
        "block_size_tokens": _int_or_none(cache.get("block_size")),
        "num_gpu_blocks": _int_or_none(cache.get("num_gpu_blocks")),
    }
    return ProbedEngine(url, served["id"], client, rng), fingerprint


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text not in (None, "None") else None
    except ValueError:
        return None
