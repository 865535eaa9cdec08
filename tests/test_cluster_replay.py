"""The replayer (``ampd.cluster.replay``) against a fake OpenAI-compatible server:
prompts that grow by exactly what the server returned, rounds sent no earlier than
the simulator would send them, ITL counting, and failures (error status, hang,
short output) confined to their session.

The fake server streams each round's ``max_tokens`` ids ``OUTPUT_BASE + i`` with
``GAP_WALL_S`` wall seconds after each chunk. All runs use ``TIME_SCALE = 0.01``
(one model second = 10 ms wall), so a three-round session takes well under a second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from ampd.core.session import Round, Session
from ampd.core.clock import ScaledClock
from ampd.cli.replay import add_arguments, run_from_args
from ampd.cluster.replay import prompt_rng, replay_sync

TIME_SCALE = 0.01
GAP_WALL_S = 0.005  # between chunks: 0.5 model seconds
OUTPUT_BASE = 50_000  # output ids, disjoint from the prompt ids (vocab below)
VOCAB = 1000
SEED = 7


@dataclass
class Received:
    """One request as the fake server saw it."""

    session_id: str
    round_index: int
    prompt: list[int]
    max_tokens: int
    last_round: bool
    at_model_s: float  # arrival, time.time() / TIME_SCALE: the ScaledClock's timebase


@dataclass
class FakeEngine:
    """Behaviour and log of the fake server. ``faults`` maps (session, round) to
    "500" (error reply), "hang" (stalls after the first token) or "short" (one
    token fewer than asked); ``chunk_tokens`` tokens go in each stream chunk."""

    faults: dict[tuple[str, int], str] = field(default_factory=dict)
    chunk_tokens: int = 1
    received: list[Received] = field(default_factory=list)

    def rounds_of(self, session_id: str) -> list[Received]:
        return [r for r in self.received if r.session_id == session_id]


def _chunk(token_ids: list[int]) -> str:
    choice = {"index": 0, "text": "x" * len(token_ids), "token_ids": token_ids}
    return "data: " + json.dumps({"choices": [choice]}) + "\n\n"


async def _stream(engine: FakeEngine, max_tokens: int, fault: str | None):
    count = max_tokens - 1 if fault == "short" else max_tokens
    sent = 0
    while sent < count:
        if fault == "hang" and sent >= 1:
            await asyncio.sleep(3600)
        ids = list(range(OUTPUT_BASE + sent, OUTPUT_BASE + min(sent + engine.chunk_tokens, count)))
        yield _chunk(ids)
        sent += len(ids)
        await asyncio.sleep(GAP_WALL_S)
    yield "data: " + json.dumps({"choices": [], "usage": {"completion_tokens": count}}) + "\n\n"
    yield "data: [DONE]\n\n"


def make_app(engine: FakeEngine) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict:
        return {}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        session_id = request.headers["X-Session-Id"]
        round_index = len(engine.rounds_of(session_id))
        engine.received.append(Received(session_id, round_index, body["prompt"], body["max_tokens"],
                                        request.headers.get("X-Session-Last-Round") == "true",
                                        time.time() / TIME_SCALE))
        assert body["stream"] and body["ignore_eos"] and body["return_token_ids"] and body["temperature"] == 0
        fault = engine.faults.get((session_id, round_index))
        if fault == "500":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        placement = ({"X-Ampd-Decode-Worker": "3", "X-Ampd-Local": "true"} if round_index == 0 else
                     {"X-Ampd-Decode-Worker": "3", "X-Ampd-Prefill-Worker": "1", "X-Ampd-Local": "false"})
        return StreamingResponse(_stream(engine, body["max_tokens"], fault), media_type="text/event-stream",
                                 headers=placement)

    return app


@pytest.fixture(scope="module")
def server():
    """(base URL, engine) of a fake server on a free loopback port; each test
    resets the engine with ``engine.__init__(...)``."""
    engine = FakeEngine()
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP; with a
    # plain socket.socket() Nagle's algorithm holds stream chunks for the client's delayed ACK (40 ms).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    uv = uvicorn.Server(uvicorn.Config(make_app(engine), log_level="warning", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.time() + 10
    while not uv.started and time.time() < deadline:
        time.sleep(0.01)
    assert uv.started, "fake server did not start"
    yield f"http://127.0.0.1:{port}", engine
    uv.should_exit = True
    thread.join(timeout=5)


def _sessions(num_sessions: int, spacing_s: float = 0.5) -> list[Session]:
    """Sessions s0, s1, ... arriving ``spacing_s`` apart, three rounds each:
    inputs 5, 3, 4; outputs 4, 2, 3; tool calls 2 s then 1 s (model seconds)."""
    rounds = (Round(5, 4, 2.0), Round(3, 2, 1.0), Round(4, 3))
    return [Session(f"s{i}", spacing_s * i, rounds) for i in range(num_sessions)]


def _replay(url: str, sessions: list[Session], timeout_s: float = 5.0):
    return replay_sync(url, sessions, model="fake", clock=ScaledClock(TIME_SCALE), ttft_slo_s=100.0,
                       itl_slo_s=100.0, vocab_size=VOCAB, seed=SEED, timeout_s=timeout_s)


def test_prompts_carry_history_and_rounds_wait_for_tool_calls(server):
    url, engine = server
    engine.__init__()
    sessions = _sessions(3)
    result = _replay(url, sessions)
    assert result.failed == [] and result.summary.num_complete == 3 and result.summary.num_rounds == 9
    assert [s.session_id for s in result.sessions] == ["s0", "s1", "s2"]
    for session, record in zip(sessions, result.sessions, strict=True):
        got = engine.rounds_of(session.session_id)
        # hand-worked prompts: 5 new ids; + 4 outputs + 3 new; + 2 outputs + 4 new
        rng = prompt_rng(SEED, session.session_id)
        new = [[rng.randrange(VOCAB) for _ in range(n)] for n in (5, 3, 4)]
        out = [list(range(OUTPUT_BASE, OUTPUT_BASE + n)) for n in (4, 2, 3)]
        assert got[0].prompt == new[0]
        assert got[1].prompt == got[0].prompt + out[0] + new[1]
        assert got[2].prompt == got[1].prompt + out[1] + new[2]
        assert [g.max_tokens for g in got] == [4, 2, 3]
        assert [g.last_round for g in got] == [False, False, True]
        assert [r.hist_tokens for r in record.rounds] == [0, 9, 14] == [session.history_tokens(i) for i in range(3)]
        assert [r.new_tokens for r in record.rounds] == [5, 3, 4]
        # round 0 at arrival; round r at previous done + tool_s, and not sent before
        assert record.rounds[0].ready_s == session.arrival_s
        assert got[0].at_model_s - result.start_s >= session.arrival_s - 1e-6
        for r in (1, 2):
            prev = record.rounds[r - 1]
            assert record.rounds[r].ready_s == prev.done_s + session.rounds[r - 1].tool_s
            assert got[r].at_model_s - result.start_s >= record.rounds[r].ready_s - 1e-6
        for rnd, r in zip(session.rounds, record.rounds, strict=True):
            assert len(r.itls_s) == rnd.output_tokens - 1
            assert r.ready_s <= r.first_token_s <= r.done_s
        assert [(r.decode_worker, r.prefill_worker, r.local) for r in record.rounds] == [
            (3, None, True), (3, 1, False), (3, 1, False)]
        assert record.done_s == record.rounds[-1].done_s


def test_multi_token_chunks_count_zero_gaps(server):
    url, engine = server
    engine.__init__(chunk_tokens=3)
    session = Session("m", 0.0, (Round(2, 7),))
    result = _replay(url, [session])
    itls = result.sessions[0].rounds[0].itls_s
    # chunks of 3, 3, 1 tokens: 2 zero gaps in the first, a real gap then 2 zeros, a real gap
    assert len(itls) == 6
    assert itls[0:2] == [0.0, 0.0] and itls[3:5] == [0.0, 0.0]
    assert itls[2] > 0 and itls[5] > 0


def test_server_error_fails_only_that_session(server):
    url, engine = server
    engine.__init__(faults={("s1", 1): "500"})
    result = _replay(url, _sessions(3))
    assert result.failed == [("s1", 1, "HTTP 500: boom")]
    assert len(engine.rounds_of("s1")) == 2  # its round 2 was never sent
    s0, s1, s2 = result.sessions
    assert s0.complete and s2.complete and not s1.complete
    assert len(s1.rounds) == 2 and s1.rounds[0].done_s is not None and s1.rounds[1].done_s is None
    assert result.summary.num_complete == 2 and result.summary.slo_attainment == pytest.approx(2 / 3)


def test_hung_server_times_out_and_is_reported(server):
    url, engine = server
    engine.__init__(faults={("h", 0): "hang"})
    sessions = [Session("h", 0.0, (Round(3, 4),)), Session("ok", 0.0, (Round(3, 4),))]
    result = _replay(url, sessions, timeout_s=0.5)  # a replay that ignored its timeout would hang here
    assert len(result.failed) == 1
    session_id, round_index, reason = result.failed[0]
    assert (session_id, round_index) == ("h", 0) and reason.startswith("timeout")
    hung, ok = result.sessions
    assert not hung.complete and hung.rounds[0].first_token_s is not None
    assert ok.complete


def test_short_output_is_a_failure(server):
    url, engine = server
    engine.__init__(faults={("s0", 2): "short"})
    result = _replay(url, _sessions(1))
    assert result.failed == [("s0", 2, "output of 2 tokens, expected 3")]


def test_unreachable_server_is_reported(server):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    result = _replay(f"http://127.0.0.1:{port}", _sessions(1))
    assert len(result.failed) == 1 and result.failed[0][:2] == ("s0", 0)
    assert result.failed[0][2].startswith("connection error")


def test_prompt_ids_depend_on_seed_and_session_only():
    def ids(seed, session_id):
        rng = prompt_rng(seed, session_id)
        return [rng.randrange(VOCAB) for _ in range(50)]
    assert ids(1, "a") == ids(1, "a")
    assert ids(1, "a") != ids(2, "a") and ids(1, "a") != ids(1, "b")


def test_cli_writes_simulate_files(server, tmp_path):
    url, engine = server
    engine.__init__()
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps({"session_id": f"t{i}", "arrival_s": float(i), "rounds": [
        {"input_tokens": 6, "output_tokens": 3, "tool_s": 0.5}, {"input_tokens": 2, "output_tokens": 2}]})
        for i in range(3)) + "\n")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--url", url, "--trace", str(trace), "--num-sessions", "3", "--rate", "5",
                              "--time-scale", str(TIME_SCALE), "--vocab-size", str(VOCAB), "--timeout-s", "5",
                              "--out", str(tmp_path / "out"), "--quiet"])
    result = run_from_args(args)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert result.failed == [] and summary["num_complete"] == 3 and summary["num_failed"] == 0
    assert config["slo"]["ttft_s"] == summary["ttft_slo_s"] and config["workload"]["trace"] == str(trace)
    assert (tmp_path / "out" / "rounds.csv").read_text().count("\n") == 6 + 1
    assert {r.session_id for r in engine.received} == {"t0", "t1", "t2"}
