"""The coordinator's HTTP API refuses bad requests with a 400 that names the
field, before any engine is called (no engine runs in these tests)."""

import asyncio

import httpx
import pytest

from ampd.config import EngineWorker, RunConfig, ServeConfig
from ampd.core.errors import InputError
from ampd.serve.app import create_app
from ampd.serve.build import build_coordinator

WORKERS = [EngineWorker(url="http://127.0.0.1:9", role="prefill"), EngineWorker(url="http://127.0.0.1:9", role="decode")]


def post(body, headers=None, path="/v1/completions", raw=None):
    config = RunConfig(cluster={"model": "Llama-3.1-8B", "gpu": "H100-SXM", "num_gpus": 2,
                                "deployment": "P:<TP=1,DP=1> D:<TP=1,DP=1>"},
                       workload={"name": "toolbench", "num_sessions": 5}, serve=ServeConfig(workers=WORKERS))
    app = create_app(build_coordinator(config, "test"))

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            if raw is not None:
                return await client.post(path, content=raw, headers=headers or {})
            return await client.post(path, json=body, headers=headers or {})
    return asyncio.run(go())


SID = {"X-Session-Id": "s1"}


@pytest.mark.parametrize("body, headers, field", [
    ({"prompt": [1, 2], "max_tokens": 2}, {}, "session id"),
    ({"prompt": [1, 2], "max_tokens": 2, "session_id": ""}, {}, "session_id"),
    ({"prompt": [1, 2], "max_tokens": 2, "session_id": 7}, {}, "session_id"),
    ({"prompt": [], "max_tokens": 2}, SID, "prompt"),
    ({"prompt": [1, -2], "max_tokens": 2}, SID, "prompt"),
    ({"prompt": [1, 2.5], "max_tokens": 2}, SID, "prompt"),
    ({"prompt": {"a": 1}, "max_tokens": 2}, SID, "prompt"),
    ({"prompt": [1, 2], "max_tokens": 0}, SID, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": "9"}, SID, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": 2, "stream": "yes"}, SID, "stream"),
    ({"prompt": [1, 2], "max_tokens": 2, "n": 3}, SID, "n"),
    ({"prompt": [1, 2], "max_tokens": 2, "n": 1.0}, SID, "n"),
    ({"prompt": [1, 2], "max_tokens": 2, "stream": True, "stream_options": "yes"}, SID, "stream_options"),
    ({"prompt": [1, 2], "max_tokens": 2, "session_id": "evil\nx"}, {}, "control characters"),
    ({"prompt": [1, 2], "max_tokens": 2, "session_id": "nul\u0000"}, {}, "control characters"),
    ({"prompt": [1, 2], "max_tokens": 9_000_000}, SID, "largest decode engine holds"),
])
def test_bad_completion_requests_are_400_naming_the_field(body, headers, field):
    reply = post(body, headers)
    assert reply.status_code == 400
    assert field in reply.json()["error"]["message"]


def test_body_that_is_not_json_is_400():
    reply = post(None, SID, raw=b"{not json")
    assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]["message"]


@pytest.mark.parametrize("messages", ["hello", [], [{"role": "user"}], [{"role": "user", "content": 3}]])
def test_bad_chat_messages_are_400(messages):
    reply = post({"messages": messages}, SID, path="/v1/chat/completions")
    assert reply.status_code == 400 and "messages" in reply.json()["error"]["message"]


def test_a_decode_engine_too_small_for_the_model_is_an_input_error():
    tiny = ServeConfig(workers=[EngineWorker(url="http://h:1", role="prefill", tp=4),
                                EngineWorker(url="http://h:2", role="decode", tp=1)])
    with pytest.raises(InputError, match=r"serve.workers\[1\] \(http://h:2\): Llama-3.1-70B does not fit in 1 x H20"):
        build_coordinator(RunConfig(serve=tiny), "x")


def test_config_without_engines_or_decode_is_an_input_error():
    with pytest.raises(InputError, match="serve.workers is empty"):
        build_coordinator(RunConfig(), "x")
    only_prefill = ServeConfig(workers=[EngineWorker(url="http://h:1", role="prefill")])
    with pytest.raises(InputError, match="decode engine"):
        build_coordinator(RunConfig(serve=only_prefill), "x")
    only_decode = ServeConfig(workers=[EngineWorker(url="http://h:1", role="decode", tp=4)])
    with pytest.raises(InputError, match="needs a prefill engine"):
        build_coordinator(RunConfig(system="pd-disagg", serve=only_decode), "x")
