"""Chat rounds by hand: the prompt check, the non-streaming reply assembled from
a stream, and the mock engine's chat server (tool calls, structured outputs,
refusals), each against values worked out from the module docstrings."""

import json

import jsonschema
import pytest
from fastapi.testclient import TestClient

from ampd.core.deployment import Role
from ampd.serve.rounds.chat import ChatReply, prompt_check, prompt_mismatch, stream_choice
from ampd.engines.client import Chunk
from ampd.engines.mock.chat import MOCK_TOOL_ROUNDS, render_call, render_chat, schema_instance, tokenize_text
from ampd.engines.mock.engine import EngineOptions
from ampd.engines.mock.server import create_app

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "minLength": 5},
                                     "days": {"type": "integer", "minimum": 2, "maximum": 7},
                                     "unit": {"enum": ["C", "F"]}},
    "required": ["city", "days", "unit"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object", "properties": {}}}}


def test_a_prompt_rendered_otherwise_is_named_and_the_same_one_passes():
    check = prompt_check([5, 6, 7], tokenizer_worker=2)
    assert prompt_mismatch(check, [5, 6, 7], "decode", 3) is None
    assert prompt_mismatch(check, None, "decode", 3) is None  # an engine that does not say cannot be checked
    problem = prompt_mismatch(check, [5, 6, 8], "prefill", 0)
    assert "prefill engine 0" in problem and "decode engine 2" in problem and "3 prompt tokens" in problem


def test_a_streamed_reply_is_assembled_as_openais_clients_assemble_it():
    events = [
        {"choices": [{"delta": {"reasoning": "think "}}]},
        {"choices": [{"delta": {"reasoning": "more"}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                                "function": {"name": "weather", "arguments": ""}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}}]},
        {"choices": [{"delta": {}, "finish_reason": "tool_calls"}]},
    ]
    reply = ChatReply()
    for i, event in enumerate(events):
        reply.add(Chunk((10 + i,), "", event))
    choice = reply.choice(max_tokens=64)
    assert choice["message"] == {"role": "assistant", "content": None, "reasoning": "think more",
                                 "tool_calls": [{"id": "c1", "type": "function",
                                                 "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]}
    assert choice["finish_reason"] == "tool_calls" and choice["token_ids"] == list(range(10, 16))
    # a text reply without a finish reason: "length" at max_tokens
    text = ChatReply()
    text.add(Chunk((1, 2), "", {"choices": [{"delta": {"content": "hi"}}]}))
    assert text.choice(max_tokens=2)["message"] == {"role": "assistant", "content": "hi"}
    assert text.choice(max_tokens=2)["finish_reason"] == "length"
    # all reasoning: content None (as vLLM's reasoning parsers leave it); nothing at all: ""
    thought, nothing = ChatReply(), ChatReply()
    thought.add(Chunk((1,), "", {"choices": [{"delta": {"reasoning": "hm"}}]}))
    nothing.add(Chunk((2,), "", {"choices": [{"delta": {}, "finish_reason": "stop"}]}))
    assert thought.choice(max_tokens=2)["message"] == {"role": "assistant", "content": None, "reasoning": "hm"}
    assert nothing.choice(max_tokens=2)["message"] == {"role": "assistant", "content": ""}
    first = stream_choice(Chunk((1,), "", {"choices": [{"delta": {"content": "h"}, "finish_reason": None}]}), True)
    assert first == {"index": 0, "delta": {"role": "assistant", "content": "h"}, "finish_reason": None,
                     "token_ids": [1]}


def test_a_schema_instance_satisfies_its_schema():
    schemas = [WEATHER["function"]["parameters"],
               {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                          "minItems": 2},
                                                 "when": {"anyOf": [{"type": "null"}, {"type": "number"}]},
                                                 "loc": {"$ref": "#/$defs/Loc"}},
                "$defs": {"Loc": {"type": "object", "properties": {"lat": {"type": "number",
                                                                            "exclusiveMinimum": 0}}}}}]
    for schema in schemas:
        jsonschema.validate(schema_instance(schema), schema)
    assert schema_instance(WEATHER["function"]["parameters"]) == {"city": "vvvvv", "days": 2, "unit": "C"}


@pytest.fixture
def engine():
    with TestClient(create_app(EngineOptions(role=Role.DECODE, worker_id=0, tp=2, time_scale=0.001))) as client:
        yield client


def chat(engine, **body):
    reply = engine.post("/v1/chat/completions", json={"model": "Llama-3.1-70B", "max_tokens": 200,
                                                      "return_token_ids": True, **body})
    return reply


def stream(engine, **body) -> list[dict]:
    reply = chat(engine, stream=True, **body)
    return [json.loads(line[5:]) for line in reply.text.splitlines()
            if line.startswith("data:") and line.strip() != "data: [DONE]"]


def test_the_mock_calls_the_named_tool_with_arguments_that_fit_its_schema(engine):
    messages = [{"role": "user", "content": "weather?"}]
    reply = chat(engine, messages=messages, tools=[CLOCK, WEATHER],
                 tool_choice={"type": "function", "function": {"name": "weather"}}).json()
    [call] = reply["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "weather" and reply["choices"][0]["finish_reason"] == "stop"  # named: vLLM
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])
    # the reply's ids are the call as the template renders it back, and its prompt is the rendered chat
    rendered = render_call("weather", call["function"]["arguments"])
    assert reply["choices"][0]["token_ids"] == tokenize_text(rendered, 32000)
    assert reply["prompt_token_ids"] == tokenize_text(render_chat({"messages": messages,
                                                                    "tools": [CLOCK, WEATHER]}), 32000)
    # streamed: the name once, then the arguments piece by piece, the same call in the end
    events = stream(engine, messages=messages, tools=[CLOCK, WEATHER],
                    tool_choice={"type": "function", "function": {"name": "weather"}})
    assert events[0]["prompt_token_ids"] == reply["prompt_token_ids"]
    fragments = [c for e in events for ch in e["choices"] for c in ch["delta"].get("tool_calls", [])]
    assert [f["function"].get("name") for f in fragments if "id" in f] == ["weather"]
    assert "".join(f["function"]["arguments"] for f in fragments) == call["function"]["arguments"]


def test_auto_calls_tools_in_turn_until_the_rounds_are_done_then_answers(engine):
    messages = [{"role": "user", "content": "go"}]
    names = []
    for _ in range(MOCK_TOOL_ROUNDS + 1):
        message = chat(engine, messages=messages, tools=[CLOCK, WEATHER]).json()["choices"][0]["message"]
        if not message.get("tool_calls"):
            break
        names.append(message["tool_calls"][0]["function"]["name"])
        messages += [message, {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "ok"}]
    assert names == ["clock", "weather", "clock", "weather"] and message["content"]
    none = chat(engine, messages=[{"role": "user", "content": "go"}], tools=[CLOCK], tool_choice="none").json()
    assert "tool_calls" not in none["choices"][0]["message"] and none["choices"][0]["finish_reason"] == "length"


def test_structured_outputs_and_refusals(engine):
    schema = WEATHER["function"]["parameters"]
    reply = chat(engine, messages=[{"role": "user", "content": "json"}],
                 response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}).json()
    jsonschema.validate(json.loads(reply["choices"][0]["message"]["content"]), schema)
    assert reply["choices"][0]["finish_reason"] == "stop"
    cut = chat(engine, messages=[{"role": "user", "content": "json"}], max_tokens=5,
               response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}).json()
    assert cut["choices"][0]["message"]["content"] == '{"cit' and cut["choices"][0]["finish_reason"] == "length"
    unknown = chat(engine, messages=[{"role": "user", "content": "x"}], tools=[CLOCK],
                   tool_choice={"type": "function", "function": {"name": "nope"}})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "tool_choice"
    bad = chat(engine, messages=[{"role": "user", "content": "x"}], response_format={"type": "yaml"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "response_format.type"


@pytest.mark.parametrize("body, param", [
    ({"tools": [{"type": "function", "function": "lookup"}]}, "tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": "weather"}}, "tools"),
    ({"response_format": {"type": "json_schema", "json_schema": "x"}}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"enum": 5}}}], "tool_choice": "required"},
     "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}}}], "tool_choice": "required"}, "tools"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": 5}]}, "messages"),
])
def test_the_mock_refuses_malformed_chat_fields_with_a_400_naming_them(engine, body, param):
    """What a break-it run found answering 500: each a 400 naming the field."""
    reply = chat(engine, **{"messages": [{"role": "user", "content": "x"}], **body})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text


def test_a_recursive_schema_gets_a_finite_instance():
    tree = {"$defs": {"node": {"type": "object", "properties": {
        "name": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node"}
    jsonschema.validate(schema_instance(tree), tree)
    linked = {"type": "object", "properties": {"next": {"$ref": "#"}}}
    jsonschema.validate(schema_instance(linked), linked)
