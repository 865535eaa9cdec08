"""Real vLLM chat engines for the agent and reasoning tests: the byte-level tiny
model (``src/ampd/engines/tiny_model.py --tokenizer bytes``, which can spell JSON), one
prefill engine, decode engines and one single server, each started with the chat
flags ``ampd up`` gives them (``chat_server_args``); prefill and decode engines
on NixlConnector, bidirectional; and a pd-disagg coordinator over them, served
in the test's event loop over ASGI.

``system = "pd-disagg"`` sends every round to the prefill engine, so every round
after a session's first is a remote incremental prefill whose history is on its
decode engine."""

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai

from ampd.config import EngineWorker, RunConfig, ServeConfig
from ampd.serve.api.app import create_app
from ampd.serve.build import build_coordinator
from ampd.engines.nixl_warmup import warm_nixl_pair
from ampd.engines.vllm_launch import NixlConnector, ServerSpec, chat_server_args
from redis_server import free_port
from ampd.engines.local_vllm import MODEL_NAME, VLLM_PYTHON, servers_running, write_tiny_model
from vllm_servers import settled_counters

MAX_TOKENS = 64
HOLD_S, KV_TIMEOUT_S, STREAM_IDLE_TIMEOUT_S, WARM_UP_TIMEOUT_S = 120, 300, 600, 600  # as test_serve_vllm_nixl
BYTE_IDS = [3 + i % 256 for i in range(96)]  # the byte tokenizer's ordinary ids (0-2 are special)
BLOCK_TOKENS = 32  # ServerSpec's block size
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")  # vllm:prompt_tokens_by_source


@contextlib.contextmanager
def chat_engines(work: Path, flags: ServeConfig, decodes: int) -> Iterator[dict[str, str]]:
    """Start "prefill", "decode-0" .. and "single" with ``flags``' chat
    arguments, warm every NIXL pair, yield their URLs by name."""
    model_dir = write_tiny_model(work, "bytes")

    def spec(role, connector):
        return ServerSpec(role=role, python=VLLM_PYTHON, model_dir=model_dir, port=free_port(), connector=connector,
                          served_model_name=MODEL_NAME, extra_args=chat_server_args(flags))

    def nixl():
        return NixlConnector(free_port(), load_failure_policy="fail", bidirectional=True,
                             decoder_kv_blocks_ttl_s=HOLD_S, ucx_tls="tcp")
    specs = {"prefill": spec("prefill", nixl()), **{f"decode-{i}": spec("decode", nixl()) for i in range(decodes)},
             "single": spec("single", None)}
    with servers_running(specs, work):
        for i in range(decodes):
            asyncio.run(warm_nixl_pair(specs["prefill"].url, specs[f"decode-{i}"].url, MODEL_NAME, BYTE_IDS,
                                       WARM_UP_TIMEOUT_S))
        yield {name: s.url for name, s in specs.items()}


def coordinator_config(urls: dict[str, str], flags: ServeConfig) -> RunConfig:
    """A pd-disagg coordinator's config over ``urls``' prefill and decode engines."""
    decodes = sorted(name for name in urls if name.startswith("decode-"))
    return RunConfig(system="pd-disagg", cluster={"model": "Llama-3.1-8B", "gpu": "H100-SXM",
                                                  "num_gpus": 1 + len(decodes),
                                                  "deployment": f"P:<TP=1,DP=1> D:<TP=1,DP={len(decodes)}>"},
                     workload={"name": "toolbench", "num_sessions": 5},
                     serve=flags.model_copy(update=dict(
                         engine="vllm-nixl", served_model=MODEL_NAME, kv_timeout_s=KV_TIMEOUT_S,
                         stream_idle_timeout_s=STREAM_IDLE_TIMEOUT_S, health_interval_s=0.5,
                         workers=[EngineWorker(url=urls["prefill"], role="prefill"),
                                  *(EngineWorker(url=urls[name], role="decode") for name in decodes)])))


async def through_coordinator(urls: dict[str, str], flags: ServeConfig, run):
    """``await run(base_url, http_client)`` against a started coordinator; its
    result, and what the coordinator and the prefill engine saw meanwhile: the
    ``infer``, ``kv-path``, ``bind`` and ``rebind`` decisions, and the change of
    the prefill engine's prompt tokens by source (``prefill_tokens``: source ->
    tokens, from its own counters)."""
    coordinator = build_coordinator(coordinator_config(urls, flags), "test-chat-vllm")
    await coordinator.start()
    before = await asyncio.to_thread(settled_counters, urls["prefill"])
    try:
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(coordinator)),
                                   base_url="http://coordinator", timeout=600)
        result = await run("http://coordinator/v1", client)
        after = await asyncio.to_thread(settled_counters, urls["prefill"])
        return result, {**{kind: coordinator.decisions.of_kind(kind) for kind in ("infer", "kv-path", "bind", "rebind")},
                        "prefill_tokens": source_change(before, after)}
    finally:
        await coordinator.stop()


async def chat_round(base_url: str, http_client: httpx.AsyncClient, messages: list[dict], stream: bool, **extra):
    """One greedy round through the OpenAI SDK with ``extra`` fields:
    ``(reasoning, content, finish_reason)``, read from the stream or the whole
    reply (vLLM's ``reasoning`` field, outside the SDK's types)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, http_client=http_client)
    request = dict(model=MODEL_NAME, messages=messages, max_tokens=MAX_TOKENS, temperature=0, **extra)
    if not stream:
        choice = (await client.chat.completions.create(**request)).choices[0]
        return (choice.message.model_extra or {}).get("reasoning"), choice.message.content, choice.finish_reason
    reasoning, content, finish = [], [], None
    async for chunk in await client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            reasoning.append((choice.delta.model_extra or {}).get("reasoning") or "")
            content.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    return "".join(reasoning) or None, "".join(content) or None, finish


def source_change(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Prompt tokens by source (``SOURCES``) between two reads of an engine's counters."""
    key = "vllm:prompt_tokens_by_source:"
    return {s: after.get(key + s, 0.0) - before.get(key + s, 0.0) for s in SOURCES}


def full_blocks(tokens: int) -> int:
    """Tokens in the whole blocks of a prefix of ``tokens``: what a prefix cache can hold of it."""
    return tokens // BLOCK_TOKENS * BLOCK_TOKENS
