"""The coordinator's HTTP API refuses bad requests with a 400 (413, 401, 403)
that names the field, before any engine is called (no engine runs in these
tests: the engines' address answers nothing)."""

import asyncio

import httpx
import pytest

from ampd.config import EngineWorker, RunConfig, ServeConfig
from ampd.core.errors import InputError
from ampd.serve.api.app import create_app
from ampd.serve.api.auth import AccessPolicy
from ampd.serve.api.body import json_depth
from ampd.serve.build import build_coordinator
from ampd.serve.api.requests import check_messages, session_key_of

WORKERS = [EngineWorker(url="http://127.0.0.1:9", role="prefill"), EngineWorker(url="http://127.0.0.1:9", role="decode")]
CONFIG = RunConfig(cluster={"model": "Llama-3.1-8B", "gpu": "H100-SXM", "num_gpus": 2,
                            "deployment": "P:<TP=1,DP=1> D:<TP=1,DP=1>"},
                   workload={"name": "toolbench", "num_sessions": 5}, serve=ServeConfig(workers=WORKERS))


def post(body, headers=None, path="/v1/completions", raw=None, access=None, limits=None, method="POST",
         client=("127.0.0.1", 4000)):
    app = create_app(build_coordinator(CONFIG, "test"), access, limits)

    async def go():
        transport = httpx.ASGITransport(app=app, client=client)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            if method == "GET":
                return await http.get(path, headers=headers or {})
            if raw is not None:
                return await http.post(path, content=raw, headers=headers or {})
            return await http.post(path, json=body, headers=headers or {})
    return asyncio.run(go())


SID = {"X-Session-Id": "s1"}


@pytest.mark.parametrize("body, headers, field", [
    ({"prompt": [1, 2], "max_tokens": 2, "session_id": ""}, {}, "session_id"),
    ({"prompt": [1, 2], "max_tokens": 2, "prompt_cache_key": ""}, {}, "prompt_cache_key"),
    ({"prompt": [1, 2], "max_tokens": 2, "prompt_cache_key": "a\nb"}, {}, "prompt_cache_key: control characters"),
    ({"prompt": [1, 2], "max_tokens": 2, "model": 7}, SID, "model: must be a string"),
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
    ({"prompt": [1, 2], "max_tokens": 2, "session_id": "x\u0085y"}, {}, "U+0085 at position 1"),  # C1 control
    ({"prompt": [1, 2], "max_tokens": 2, "session_id": "abc\u202egpj.exe"}, {}, "U+202E at position 3"),  # bidi
    ({"prompt": [1, 2], "max_tokens": 2, "session_id": "a\u200bb"}, {}, "U+200B"),  # zero-width space
    ({"prompt": [1, 2], "max_tokens": 2, "session_id": "a\u2028b"}, {}, "U+2028"),  # line separator
    ({"prompt": [1, 2], "max_tokens": 2, "session_end": "true"}, SID, "session_end: must be true or false"),
    ({"prompt": [1, 2], "max_tokens": 2, "session_end": 1}, SID, "session_end: must be true or false"),
    ({"prompt": [1, 2], "max_tokens": 2}, {**SID, "X-Session-Last-Round": "maybe"}, "X-Session-Last-Round"),
])
def test_bad_completion_requests_are_400_naming_the_field(body, headers, field):
    reply = post(body, headers)
    assert reply.status_code == 400
    assert field in reply.json()["error"]["message"]


def test_body_that_is_not_json_is_400():
    reply = post(None, SID, raw=b"{not json")
    assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]["message"]


@pytest.mark.parametrize("raw, field", [
    (b'{"prompt": [1, 2], "temperature": NaN}', "temperature: NaN"),
    (b'{"prompt": [1, 2], "top_p": Infinity}', "top_p: Infinity"),
    (b'{"prompt": [1, 2], "logit_bias": {"7": -Infinity}}', "logit_bias.7: -Infinity"),
    (b'{"prompt": [1, 2], "extra": [0, {"x": 1e999}]}', "extra[1].x: 1e999"),
    (b'{"prompt": [1, 2], "n": 1' + b"0" * 5000 + b"}", "not valid JSON"),  # an integer of 5001 digits
    (b'{"prompt": [1, 2], "x": "\xff"}', "not UTF-8"),
])
def test_numbers_json_does_not_have_and_bad_bytes_are_400_naming_the_field(raw, field):
    reply = post(None, SID, raw=raw)
    assert reply.status_code == 400 and field in reply.json()["error"]["message"]


@pytest.mark.parametrize("path, raw, field", [
    ("/v1/completions", b'{"prompt": [1, 2], "session_id": "a\\ud800"}', "session_id"),
    ("/v1/completions", b'{"prompt": "hello \\udfff"}', "prompt"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}, {"role": "user", '
                             b'"content": [{"type": "text", "text": "\\ud83d"}]}]}', "messages[1].content[0].text"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "\\udc00k": 1}', "\\udc00k"),
])
def test_a_lone_surrogate_escaped_in_json_is_400_naming_its_field(path, raw, field):
    """Valid JSON, but no UTF-8 text: refused before anything (the engines'
    /tokenize among them) is sent it; a surrogate pair is a character."""
    reply = post(None, SID, path=path, raw=raw)
    assert reply.status_code == 400
    assert reply.json()["error"]["message"].startswith(f"{field}: a lone UTF-16 surrogate")


def test_a_surrogate_pair_is_a_character():
    reply = post(None, raw=b'{"prompt": [1, 2], "session_id": "smile-\\ud83d\\ude00", "max_tokens": 9000000}')
    assert "largest decode engine" in reply.json()["error"]["message"]  # parsed, then checked


def test_a_string_left_open_full_of_escaped_quotes_is_refused_as_it_is():
    """The depth scan would take quadratic time on it (each escaped quote would
    start a string match running to the end): the parser refuses it first."""
    reply = post(None, SID, raw=b'{"prompt": [1], "x": "' + b'\\"' * 4_000_000)  # 8 MB
    assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]["message"]


def test_depth_is_measured_outside_strings_and_limited():
    assert json_depth(b'{"a": [1, {"b": "[[[[{{"}], "c": "]]"}') == 3
    assert json_depth(b'"[[["') == 0
    limit = ServeConfig().max_json_depth
    deep = b'{"prompt": [1, 2], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # the issue's RecursionError
    reply = post(None, SID, raw=deep)
    assert reply.status_code == 400 and f"nested deeper than {limit} levels" in reply.json()["error"]["message"]
    fits = b'{"prompt": [1, 2], "max_tokens": 9000000, "x": ' + b"[" * (limit - 1) + b"]" * (limit - 1) + b"}"
    assert "largest decode engine" in post(None, SID, raw=fits).json()["error"]["message"]  # parsed, then checked


def test_a_body_over_the_limit_is_413_with_the_limit_whether_its_length_is_announced_or_not():
    limits = ServeConfig(max_body_bytes=4096)
    body = b'{"prompt": [1, 2], "pad": "' + b"x" * 5000 + b'"}'
    announced = post(None, SID, raw=body, limits=limits)

    async def chunks():  # no Content-Length: the body is counted as it arrives
        for i in range(0, len(body), 1000):
            yield body[i:i + 1000]
    streamed = post(None, SID, raw=chunks(), limits=limits)
    for reply in (announced, streamed):
        assert reply.status_code == 413
        assert reply.json()["error"]["message"] == "request body: larger than 4096 bytes (serve.max_body_bytes)"


@pytest.mark.parametrize("messages", ["hello", [], [{"role": "user"}], [{"role": "user", "content": 3}],
                                      [{"role": "user", "content": []}],
                                      [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}]])
def test_bad_chat_messages_are_400(messages):
    reply = post({"messages": messages}, SID, path="/v1/chat/completions")
    assert reply.status_code == 400 and "messages" in reply.json()["error"]["message"]


def test_chat_content_as_text_parts_is_joined_as_vllm_joins_it():
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert check_messages(parts) == [{"role": "user", "content": "a\nb"}]


def test_tool_calls_and_tool_results_pass_and_a_user_message_without_content_does_not():
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages = [{"role": "user", "content": "use f"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    assert check_messages(messages) == messages
    assert check_messages(messages[1:2] + [{"role": "assistant", "tool_calls": [call]}])[1]["content"] is None
    reply = post({"messages": [{"role": "user", "content": None}]}, SID, path="/v1/chat/completions")
    assert reply.status_code == 400 and "messages[0].content" in reply.json()["error"]["message"]
    reply = post({"messages": messages, "tools": {"f": 1}}, SID, path="/v1/chat/completions")
    assert reply.status_code == 400 and "tools: must be a list" in reply.json()["error"]["message"]


CORRELATION = ("X-Correlation-ID",)


@pytest.mark.parametrize("body, headers, configured, found", [
    ({"session_id": "b", "prompt_cache_key": "c"}, {"X-Session-Id": "h", "X-Correlation-ID": "x"}, CORRELATION,
     ("h", "X-Session-Id")),
    ({"session_id": "b", "prompt_cache_key": "c"}, {"x-correlation-id": "x"}, CORRELATION, ("x", "X-Correlation-ID")),
    ({"session_id": "b", "prompt_cache_key": "c"}, {"X-Correlation-ID": "x"}, (), ("b", "session_id")),
    ({"prompt_cache_key": "c"}, {}, CORRELATION, ("c", "prompt_cache_key")),
    ({}, {"X-Correlation-ID": "x"}, (), (None, "prompt")),  # a header not configured names nothing
])
def test_session_keys_are_taken_in_the_documented_order(body, headers, configured, found):
    assert session_key_of(body, httpx.Headers(headers), configured) == found


def test_an_unknown_model_is_404_with_openais_error_body_and_aliases_are_served():
    limits = ServeConfig(served_model_aliases=["my-agent-model"])
    reply = post({**TOO_BIG, "model": "gpt-4o"}, SID, limits=limits)
    assert reply.status_code == 404
    assert reply.json() == {"error": {"message": "The model `gpt-4o` does not exist or you do not have access to it.",
                                      "type": "invalid_request_error", "param": None, "code": "model_not_found"}}
    for model in ("Llama-3.1-8B", "my-agent-model"):  # served: past the model check, to the next 400
        assert post({**TOO_BIG, "model": model}, SID, limits=limits).status_code == 400
    chat = post({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, SID, limits=limits,
                path="/v1/chat/completions")
    assert chat.status_code == 404 and chat.json()["error"]["code"] == "model_not_found"
    models = post(None, path="/v1/models", method="GET", limits=limits).json()
    assert [m["id"] for m in models["data"]] == ["Llama-3.1-8B", "my-agent-model"]


def test_a_header_is_read_as_utf8_and_its_bad_bytes_are_400():
    reply = post({"prompt": [1, 2], "max_tokens": 9_000_000}, {"X-Session-Id": "\xff\xfe".encode("latin-1")})
    assert reply.status_code == 400 and "X-Session-Id: not valid UTF-8" in reply.json()["error"]["message"]


KEYS = AccessPolicy.load(environ={"AMPD_API_KEYS": "key-a, key-b", "AMPD_ADMIN_KEYS": "root"})
TOO_BIG = {"prompt": [1, 2], "max_tokens": 9_000_000}  # a 400 past the key check: no engine is called


@pytest.mark.parametrize("headers, status, message", [
    ({}, 401, "missing API key"),
    ({"Authorization": "Bearer nope"}, 401, "invalid API key"),
    ({"Authorization": "Basic a2V5LWE="}, 401, "missing API key"),
    ({"Authorization": "Bearer key-b"}, 400, "largest decode engine"),
])
def test_with_client_keys_the_openai_endpoints_want_one(headers, status, message):
    reply = post(TOO_BIG, {**SID, **headers}, access=KEYS)
    assert reply.status_code == status and message in reply.json()["error"]["message"]
    if status == 401:
        assert reply.headers["www-authenticate"] == "Bearer"
    models = post(None, headers, path="/v1/models", access=KEYS, method="GET")
    assert models.status_code == (200 if status == 400 else 401)


def test_without_keys_the_openai_endpoints_are_open():
    assert post(TOO_BIG, SID).status_code == 400


@pytest.mark.parametrize("path", ["/metrics", "/ampd/decisions"])
def test_admin_endpoints_want_an_admin_key_or_loopback(path):
    def get(access=None, headers=None, client=("127.0.0.1", 4000)):
        return post(None, headers, path=path, access=access, method="GET", client=client).status_code
    assert get() == 200 and get(client=("::1", 4000)) == 200  # no admin keys: loopback only
    assert get(client=("10.0.0.7", 4000)) == 403
    assert get(KEYS) == 401  # admin keys: even loopback must show one
    assert get(KEYS, {"Authorization": "Bearer key-a"}) == 403  # a client key is not an admin key
    assert get(KEYS, {"Authorization": "Bearer root"}, client=("10.0.0.7", 4000)) == 200


def test_key_files_are_read_and_a_bad_one_is_an_input_error(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# clients\nkey-c\n\n  key-d  \n")
    policy = AccessPolicy.load(str(path), environ={})
    assert len(policy.client_scopes) == 2 and not policy.admin_digests
    assert len(set(policy.client_scopes.values())) == 2  # one scope per key
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(InputError, match="holds no key"):
        AccessPolicy.load(str(tmp_path / "empty"), environ={})
    with pytest.raises(InputError, match="cannot read the key file"):
        AccessPolicy.load("", str(tmp_path / "missing"), environ={})


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
