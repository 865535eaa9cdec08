"""The mock engine, its clock and its real-time event loop.

Times are model seconds: a mock engine at ``time_scale`` s runs 1/s times faster
than real time. Event-loop jitter (asyncio timers fire up to ~1 ms of wall time
late, and HTTP adds some) only delays what a client sees, so timing checks are a
lower bound from the performance model (never an upper bound: speed is for bench/); the exact
model times are checked against the simulator without HTTP.
"""

import asyncio
import json
import math
import time

import httpx
import pytest

from app_server import serving

from ampd.core.deployment import Role, WorkerSpec
from ampd.core.task import PrefillTask
from ampd.policy.reorder import Fcfs
from ampd.core.clock import ScaledClock
from ampd.engines.client import EngineClient
from ampd.engines.mock.engine import DEFAULT_VOCAB_SIZE, EngineOptions, MockEngine, engine_perf_model, token_id
from ampd.engines.mock.requests import parse_request
from ampd.engines.mock.server import create_app, main
from ampd.engines.mock.wallclock_loop import WallClockLoop
from ampd.sim.decode_worker import SimDecodeWorker
from ampd.sim.engine import EventLoop

SCALE = 0.02  # a model second lasts 20 wall ms
TP = 4  # Llama-3.1-70B on H20 needs 2+ GPUs
PERF = engine_perf_model(EngineOptions.model, EngineOptions.gpu)


def _app(role: Role, worker_id: int = 0, **kw):
    return create_app(EngineOptions(role, worker_id, TP, time_scale=SCALE, **kw))


def _body(prompt: list[int], max_tokens: int, stream: bool = True, **extra) -> dict:
    return {"model": EngineOptions.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, "stream": stream,
            "stream_options": {"include_usage": True}, **extra}


def _events(text: str) -> list:
    """The SSE ``data:`` payloads, JSON-decoded except ``[DONE]``."""
    datas = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    return [d if d == "[DONE]" else json.loads(d) for d in datas]


def _stream_tokens(events: list) -> list[int]:
    return [t for e in events if e != "[DONE]" and e["choices"] for t in e["choices"][0]["token_ids"]]


def _client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://mock")


def _expected(session_id: str, prompt_tokens: int, max_tokens: int) -> list[int]:
    return [token_id(session_id, prompt_tokens, i) for i in range(max_tokens)]


# --- clock and loop ---------------------------------------------------------------

@pytest.mark.parametrize("scale", [0.0, -1.0, math.nan, math.inf])
def test_scaled_clock_rejects_a_bad_time_scale(scale):
    with pytest.raises(ValueError, match="time_scale"):
        ScaledClock(scale)


def test_scaled_clock_converts_model_and_wall_seconds():
    clock = ScaledClock(0.5)
    assert clock.wall_s(2.0) == 1.0
    assert abs(clock.now_s() - time.time() / 0.5) < 0.1
    start = time.monotonic()
    asyncio.run(clock.sleep(0.04))
    assert time.monotonic() - start >= 0.02


def test_wallclock_loop_orders_by_time_priority_then_scheduling():
    async def scenario():
        loop = WallClockLoop(ScaledClock(SCALE))
        ran, done = [], asyncio.Event()

        def note(name, time_s, last=False):
            ran.append((name, loop.now_s, time_s))
            if name == "first":
                loop.after(0.1, note, "chained", time_s + 0.1)
            if last:
                done.set()

        t0 = loop.now_s
        loop.at(t0 + 0.5, note, "b", t0 + 0.5, True, priority=1)
        loop.at(t0 + 0.5, note, "a1", t0 + 0.5)
        loop.at(t0 + 0.5, note, "a2", t0 + 0.5)
        loop.at(t0 + 0.2, note, "first", t0 + 0.2)
        loop.at(t0 - 1.0, note, "past", t0)
        with pytest.raises(ValueError):
            loop.at(math.inf, note, "never", 0.0)
        await asyncio.wait_for(done.wait(), 5)
        return ran

    ran = asyncio.run(scenario())
    assert [name for name, _, _ in ran] == ["past", "first", "chained", "a1", "a2", "b"]
    for _, now_s, time_s in ran:
        assert now_s == pytest.approx(time_s, abs=1e-4)  # the event's own time, not the late timer's


class _Recorder:
    """A sink that joins every first token with ``outputs[session]`` tokens."""

    def __init__(self, loop, outputs: dict[str, int]) -> None:
        self.loop, self.outputs, self.log, self.worker = loop, outputs, [], None
        self.start_s = loop.now_s

    def first_token(self, task, prefill_worker, local):
        self.log.append(("first", task.session_id, self.loop.now_s))
        self.worker.join(task, self.outputs[task.session_id])

    def round_done(self, session_id, round_index, itls):
        self.log.append(("done", session_id, self.loop.now_s))


def _decode_scenario(loop) -> _Recorder:
    """Two local prefills queued at once on one decode worker."""
    sink = _Recorder(loop, {"a": 4, "b": 6})
    sink.worker = SimDecodeWorker(WorkerSpec(0, Role.DECODE, TP, 0), loop, PERF, Fcfs(), sink, 10.0)
    for session_id, new_tokens in (("a", 1000), ("b", 500)):
        loop.at(sink.start_s, sink.worker.enqueue_local, PrefillTask(session_id, 0, 0, new_tokens, sink.start_s, 0))
    return sink


def test_decode_worker_on_the_wallclock_loop_keeps_the_simulators_times():
    sim_loop = EventLoop()
    sim = _decode_scenario(sim_loop)
    sim_loop.run()

    async def real():
        sink = _decode_scenario(WallClockLoop(ScaledClock(SCALE)))
        while len(sink.log) < 4:
            await asyncio.sleep(0.005)
        return [(kind, sid, t - sink.start_s) for kind, sid, t in sink.log]

    got = asyncio.run(asyncio.wait_for(real(), 10))
    assert [(k, s) for k, s, _ in got] == [(k, s) for k, s, _ in sim.log]
    assert [t for _, _, t in got] == pytest.approx([t for _, _, t in sim.log], abs=1e-4)
    assert sim.log[0][2] == PERF.prefill_s(0, 1000, TP)


def test_first_token_comes_after_the_prefill_time_then_one_decode_step_per_token():
    engine = MockEngine(EngineOptions(Role.DECODE, 0, TP, time_scale=SCALE))
    clock = engine.loop.clock
    request = parse_request(_body(list(range(2000)), 5), EngineOptions.model, DEFAULT_VOCAB_SIZE)

    async def go():
        start_s = clock.now_s()
        rnd = engine.submit(request, "t")
        times_s = []
        while await rnd.events.get() is not None:
            times_s.append(clock.now_s() - start_s)
        return times_s

    times_s = asyncio.run(asyncio.wait_for(go(), 10))
    assert len(times_s) == 5
    ttft_s = PERF.prefill_s(0, 2000, TP)
    done_s = ttft_s + sum(PERF.decode_step_s(1, 2001 + i, TP) for i in range(4))
    # the wall clock can only delay a token past its model time, never bring it forward
    assert times_s[0] >= ttft_s - 1e-3 and times_s[-1] >= done_s - 1e-3


# --- engine API ---------------------------------------------------------------------

def test_health_and_models():
    async def go():
        async with _client(_app(Role.DECODE)) as c:
            return await c.get("/health"), await c.get("/v1/models")

    health, models = asyncio.run(go())
    assert health.status_code == 200
    assert [m["id"] for m in models.json()["data"]] == [EngineOptions.model]


def test_local_rounds_stream_their_tokens_and_hit_the_prefix_cache():
    p1 = list(range(300))

    async def go():
        async with _client(_app(Role.DECODE)) as c:
            r1 = await c.post("/v1/completions", json=_body(p1, 8), headers={"X-Session-Id": "s"})
            p2 = p1 + _stream_tokens(_events(r1.text)) + list(range(50))
            r2 = await c.post("/v1/completions", json=_body(p2, 5, stream=False), headers={"X-Session-Id": "s"})
            return r1, r2, p2

    r1, r2, p2 = asyncio.run(go())
    events = _events(r1.text)
    assert events[-1] == "[DONE]"
    assert _stream_tokens(events) == _expected("s", 300, 8)
    assert [e["choices"][0]["finish_reason"] for e in events[:-2]] == [None] * 7 + ["length"]
    assert events[-2]["choices"] == []
    assert events[-2]["usage"] == {"prompt_tokens": 300, "completion_tokens": 8, "total_tokens": 308,
                                   "prompt_tokens_details": {"cached_tokens": 0}}
    reply = r2.json()
    assert reply["choices"][0]["token_ids"] == _expected("s", len(p2), 5)
    assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] == 300 + 8
    assert "kv_transfer_params" not in reply


def test_a_last_round_frees_the_sessions_kv():
    prompt = list(range(100))

    async def go():
        async with _client(_app(Role.DECODE)) as c:
            last = {"X-Session-Id": "s", "X-Session-Last-Round": "true"}
            await c.post("/v1/completions", json=_body(prompt, 3, stream=False), headers=last)
            again = await c.post("/v1/completions", json=_body(prompt + [7, 7], 3, stream=False),
                                 headers={"X-Session-Id": "s"})
            return again.json()

    assert asyncio.run(go())["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def _prefill_params(hist_tokens: int = 0) -> dict:
    return {"do_remote_decode": True, "do_remote_prefill": False, "ampd_hist_tokens": hist_tokens,
            "ampd_decode_tp": TP, "ampd_decode_server": 1}


def test_remote_prefill_replies_with_kv_params_and_decode_streams_the_same_tokens():
    prompt, session = list(range(1200)), {"X-Session-Id": "r"}
    prefill_app, decode_app, local_app = _app(Role.PREFILL, 0), _app(Role.DECODE, 1), _app(Role.DECODE, 2)

    async def go():
        async with _client(prefill_app) as p, _client(decode_app) as d, _client(local_app) as loc:
            start = time.time()
            pre = await p.post("/v1/completions", headers=session,
                               json=_body(prompt, 1, stream=False, kv_transfer_params=_prefill_params()))
            prefill_s = (time.time() - start) / SCALE
            params = pre.json()["kv_transfer_params"]
            dec = await d.post("/v1/completions", json=_body(prompt, 6, kv_transfer_params=params), headers=session)
            local = await loc.post("/v1/completions", json=_body(prompt, 6), headers=session)
            return pre.json(), prefill_s, dec, local

    pre, prefill_s, dec, local = asyncio.run(go())
    assert pre["kv_transfer_params"] == {"do_remote_prefill": True, "do_remote_decode": False,
                                         "ampd_prefill_worker": 0, "ampd_prompt_tokens": 1200}
    assert pre["choices"][0]["token_ids"] == [token_id("r", 1200, 0)]
    assert pre["usage"]["completion_tokens"] == 1
    p_spec, d_spec = WorkerSpec(0, Role.PREFILL, TP, 0), WorkerSpec(-1, Role.DECODE, TP, 1)
    model_s = PERF.kv_transfer_s(0, d_spec, p_spec) + PERF.prefill_s(0, 1200, TP) + PERF.kv_transfer_s(1200, p_spec, d_spec)
    assert prefill_s >= model_s - 1e-3  # the reply never comes before the model's time
    assert dec.status_code == 200
    tokens = _stream_tokens(_events(dec.text))
    assert tokens == _expected("r", 1200, 6) == _stream_tokens(_events(local.text))
    assert tokens[0] == pre["choices"][0]["token_ids"][0]


def test_a_plain_prefill_on_a_prefill_engine_sends_no_kv_and_counts_its_prefill_time():
    # A vLLM engine behind a KV connector serves plain requests too (the profile's shared-host
    # probe sends them): the prefill alone, its KV going nowhere.
    prompt = list(range(1000))

    async def go():
        async with _client(_app(Role.PREFILL, 0)) as p:
            reply = await p.post("/v1/completions", headers={"X-Session-Id": "plain"},
                                 json=_body(prompt, 1, stream=False))
            return reply, (await p.get("/metrics")).text

    reply, metrics = asyncio.run(go())
    assert reply.status_code == 200
    body = reply.json()
    assert "kv_transfer_params" not in body
    assert body["choices"][0]["token_ids"] == [token_id("plain", 1000, 0)]
    lines = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line and not line.startswith("#"))
    # One prefill of at least T_pre(0, 1000) at TP 4 (model seconds; jitter only adds), and no transfer.
    assert float(lines["vllm:request_prefill_time_seconds_count"]) == 1
    assert float(lines["vllm:request_prefill_time_seconds_sum"]) >= PERF.prefill_s(0, 1000, TP) - 1e-9
    assert float(lines["vllm:nixl_xfer_time_seconds_count"]) == 0


def test_a_failed_kv_load_is_a_503_before_any_token_and_local_recompute_follows():
    prompt, session = list(range(400)), {"X-Session-Id": "f"}
    app = _app(Role.DECODE, kv_fail_rate=1.0)
    remote = {"do_remote_prefill": True, "do_remote_decode": False, "ampd_prefill_worker": 0,
              "ampd_prompt_tokens": 400}

    async def go():
        async with _client(app) as c:
            failed = await c.post("/v1/completions", json=_body(prompt, 4, kv_transfer_params=remote), headers=session)
            retried = await c.post("/v1/completions", json=_body(prompt, 4), headers=session)
            return failed, retried

    failed, retried = asyncio.run(go())
    assert failed.status_code == 503
    assert failed.json()["error"]["message"].startswith("KV transfer failed")
    assert not app.state.engine.rounds
    events = _events(retried.text)
    assert _stream_tokens(events) == _expected("f", 400, 4)
    assert events[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


_BAD = [
    (Role.DECODE, {"prompt": "hello"}, 400, "prompt"),
    (Role.DECODE, {"prompt": [1, -1]}, 400, "prompt"),
    (Role.DECODE, {"prompt": [32000]}, 400, "prompt"),
    (Role.DECODE, {"prompt": [[1, 2]]}, 400, "prompt"),
    (Role.DECODE, {"max_tokens": 0}, 400, "max_tokens"),
    (Role.DECODE, {"max_tokens": "4"}, 400, "max_tokens"),
    (Role.DECODE, {"max_tokens": 10**7}, 400, "max_tokens"),
    (Role.DECODE, {"stream": "yes"}, 400, "stream"),
    (Role.DECODE, {"model": "gpt-2"}, 404, "model"),
    (Role.DECODE, {"kv_transfer_params": _prefill_params()}, 400, "kv_transfer_params.do_remote_decode"),
    (Role.PREFILL, {"max_tokens": 1, "kv_transfer_params": {"do_remote_decode": False}}, 400,
     "kv_transfer_params.do_remote_decode"),
    (Role.PREFILL, {"max_tokens": 2}, 400, "max_tokens"),
    (Role.PREFILL, {"max_tokens": 2, "kv_transfer_params": _prefill_params()}, 400, "max_tokens"),
    (Role.PREFILL, {"max_tokens": 1, "kv_transfer_params": _prefill_params(10)}, 400,
     "kv_transfer_params.ampd_hist_tokens"),
    (Role.PREFILL, {"max_tokens": 1, "kv_transfer_params": {**_prefill_params(), "ampd_decode_tp": None}}, 400,
     "kv_transfer_params.ampd_decode_tp"),
]


@pytest.mark.parametrize("role, change, status, field", _BAD)
def test_a_bad_request_is_refused_naming_the_field(role, change, status, field):
    body = {**_body(list(range(10)), 4, stream=False), **change}

    async def go():
        async with _client(_app(role)) as c:
            return await c.post("/v1/completions", json=body, headers={"X-Session-Id": "bad"})

    reply = asyncio.run(go())
    assert reply.status_code == status
    error = reply.json()["error"]
    assert error["param"] == field and field in error["message"]
    assert error["type"] == ("NotFoundError" if status == 404 else "BadRequestError")


def test_a_body_that_is_not_json_is_a_400():
    async def go():
        async with _client(_app(Role.DECODE)) as c:
            return await c.post("/v1/completions", content=b"{not json")

    reply = asyncio.run(go())
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "body"


def test_bad_options_exit_with_2_naming_them(capsys):
    common = ["--role", "decode", "--worker-id", "0", "--port", "1"]
    assert main(common + ["--tp", "1"]) == 2  # 70B weights do not fit one H20
    assert main(common + ["--tp", "4", "--time-scale", "0"]) == 2
    assert main(common + ["--tp", "4", "--kv-fail-rate", "2"]) == 2
    assert main(common + ["--tp", "4", "--network-gb-per-s", "0"]) == 2
    err = capsys.readouterr().err
    assert "time_scale" in err and "kv_fail_rate" in err and "network_gb_per_s" in err


# --- over a real socket -----------------------------------------------------------

def test_a_client_may_leave_mid_stream_and_the_sequence_decodes_on():
    app = create_app(EngineOptions(Role.DECODE, 0, TP, time_scale=0.05))  # 400 tokens last ~0.6 wall s
    engine, prompt = app.state.engine, list(range(2000))
    with serving(app) as url, httpx.Client(base_url=url, timeout=10) as client:
        with client.stream("POST", "/v1/completions", json=_body(prompt, 400), headers={"X-Session-Id": "d"}) as r:
            first = next(line for line in r.iter_lines() if line.startswith("data: "))
        assert json.loads(first[6:])["choices"][0]["token_ids"] == _expected("d", 2000, 1)
        assert len(engine.rounds) == 1  # the client left; the sequence is still decoding
        deadline = time.monotonic() + 5
        while engine.rounds and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not engine.rounds  # ... up to its last token
        again = client.post("/v1/completions", json=_body(prompt + _expected("d", 2000, 400) + [1], 2, stream=False),
                            headers={"X-Session-Id": "d"})
        assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 2400


def test_tokenize_is_bytes_and_renders_chat_messages():
    from ampd.engines.mock.chat import tokenize_body
    assert tokenize_body({"prompt": "ab"}, 32000)["tokens"] == [3 + 97, 3 + 98]
    chat = tokenize_body({"messages": [{"role": "user", "content": "hi"}]}, 32000)
    assert chat["count"] == len("user: hi\nassistant: ")  # the reply follows "assistant: "
    with pytest.raises(ValueError, match="prompt"):
        tokenize_body({"prompt": 3}, 32000)


def test_the_coordinators_client_keeps_one_connection_across_streamed_rounds():
    # A streamed round read to its [DONE] must hand its connection back to the pool: the
    # engine sees every round of a session, and the next session's, arrive on one TCP
    # connection (the client's port, as the server saw it, never changes).
    seen_ports = []
    app = _app(Role.DECODE)

    async def counting(scope, receive, send):
        if scope["type"] == "http":
            seen_ports.append(scope["client"][1])
        await app(scope, receive, send)

    async def go(url):
        engines = EngineClient()
        try:
            for session_id in ("a", "a", "b"):
                tokens = [t for chunk in [c async for c in engines.stream(url, _body(list(range(40)), 3), session_id)]
                          for t in chunk.token_ids]
                assert len(tokens) == 3
        finally:
            await engines.close()

    with serving(counting) as url:
        asyncio.run(go(url))
    assert len(seen_ports) == 3 and len(set(seen_ports)) == 1


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_a_stream_that_stays_open_after_done_still_ends_its_round(ending):
    # A server may end its lines in CR, LF or CR LF, and keep the body open after [DONE]:
    # the round is complete at [DONE] (the client's idle timeout, 30 s here, must not fire
    # and call the engine broken).
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for token in (5, 6):
            event = json.dumps({"choices": [{"text": "x", "token_ids": [token]}]}).encode()
            await send({"type": "http.response.body", "body": b"data: " + event + ending + ending, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]" + ending + ending, "more_body": True})
        while (await receive())["type"] != "http.disconnect":  # never ends the body; the client leaves
            pass

    async def go(url):
        engines = EngineClient(stream_idle_timeout_s=30.0)
        try:
            return [t for c in [c async for c in engines.stream(url, _body([1, 2], 2), "s")] for t in c.token_ids]
        finally:
            await engines.close()

    with serving(app) as url:
        assert asyncio.run(go(url)) == [5, 6]
