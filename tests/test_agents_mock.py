"""Agent frameworks run their tool loops through ampd (docs/AGENTS.md): the
OpenAI Agents SDK and a LangGraph ReAct agent, unmodified, against the
documented mock cluster (configs/serve_mock.toml: two prefill and two decode
engines, Redis, a coordinator), with no session key and with one, streaming
and not. The mock engine answers as a vLLM chat server with a tool parser
does (``ampd.engines.mock.chat``): ``MOCK_TOOL_ROUNDS`` tool calls, then text.

What is checked, each against a value worked out independently:
- every tool call the agent received names a tool and carries arguments that
  validate against the tool's own JSON schema (``jsonschema``), and the tool
  ran that many times, then the agent ended with a text answer;
- the rounds of one agent run are one session on one decode engine, each
  round after the first found from its prompt (no header), with the previous
  round's prompt and reply as its history (``cached_tokens`` = that round's
  prompt + completion tokens, read from the usage of the previous reply);
- the calls and final text equal the same agent's run against one mock decode
  engine directly (the mock's replies are a function of the request, as greedy
  decoding is).
"""

import asyncio
import json
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent

from ampd.config import load_config, override
from ampd.engines.mock.chat import MOCK_TOOL_ROUNDS
from ampd.cluster.up import LocalCluster, free_serve_ports

ROOT = Path(__file__).resolve().parent.parent

MAX_TOKENS = 128  # a tool call of the mock is ~60 tokens (one a character)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    config, _ = load_config(ROOT / "configs" / "serve_mock.toml")
    with LocalCluster(override(config, serve=free_serve_ports(coordinators=1)), tmp_path_factory.mktemp("agents"),
                      coordinators=1) as running:
        yield running


def model_name(cluster) -> str:
    return cluster.config.cluster.model


def decode_url(cluster) -> str:
    """One decode engine of the cluster, for the direct runs."""
    return next(child.health_url for child in cluster.engines.values() if child.name.endswith("-decode"))


class UsageLog(httpx.AsyncBaseTransport):
    """An httpx transport that records each chat reply's ampd headers and usage
    (the frameworks read neither)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.rounds: list[dict] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/chat/completions"):
            body = await response.aread()
            usage = json.loads(body).get("usage") if not body.startswith(b"data:") else _stream_usage(body)
            self.rounds.append({"session": response.headers.get("x-ampd-session-id"),
                                "decode": response.headers.get("x-ampd-decode-worker"),
                                "round": response.headers.get("x-ampd-round"), "usage": usage})
            return httpx.Response(response.status_code, headers=response.headers, content=body,
                                  request=request)
        return response


def _stream_usage(body: bytes) -> dict | None:
    events = [json.loads(line[5:]) for line in body.decode().splitlines()
              if line.startswith("data:") and line.strip() != "data: [DONE]"]
    return next((e["usage"] for e in reversed(events) if e.get("usage")), None)


def sdk_client(base_url: str, log: UsageLog, headers: dict | None = None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120,
                              default_headers=headers, http_client=httpx.AsyncClient(transport=log, timeout=120))


# --- the tools: real Python functions the agents call ------------------------------------------

CALLS: list[tuple[str, dict]] = []


def lookup_city(city: str, days: int) -> str:
    """Weather of a city for some days."""
    CALLS.append(("lookup_city", {"city": city, "days": days}))
    return f"{city}: sunny for {days} days"


def convert_units(value: float, unit: str) -> str:
    """Convert a temperature to another unit."""
    CALLS.append(("convert_units", {"value": value, "unit": unit}))
    return f"{value} {unit}"


def run_openai_agent(base_url: str, model: str, stream: bool, headers: dict | None = None) -> tuple[list, str, list]:
    """The OpenAI Agents SDK: a forced first call (``tool_choice`` required,
    which the SDK resets after a call), two function tools; returns the tool
    calls it made, its final output and the rounds' usage."""
    set_tracing_disabled(True)
    log = UsageLog()
    agent = Agent(name="weather", instructions="Answer with the tools.",
                  model=OpenAIChatCompletionsModel(model=model, openai_client=sdk_client(base_url, log, headers)),
                  tools=[function_tool(lookup_city), function_tool(convert_units)],
                  model_settings=ModelSettings(tool_choice="required", max_tokens=MAX_TOKENS, include_usage=True))
    CALLS.clear()

    async def go():
        if stream:
            result = Runner.run_streamed(agent, "Weather in Paris, in kelvin?", max_turns=10)
            async for _ in result.stream_events():
                pass
            return result
        return await Runner.run(agent, "Weather in Paris, in kelvin?", max_turns=10)
    result = asyncio.run(go())
    return list(CALLS), str(result.final_output), log.rounds


def run_langgraph_agent(base_url: str, model: str, stream: bool, headers: dict | None = None):
    """A LangGraph ReAct agent on ``ChatOpenAI`` (``tool_choice`` auto); returns
    the tool calls as its messages hold them, the final text, the rounds' usage
    and the tools' schemas."""
    log = UsageLog()
    llm = ChatOpenAI(model=model, base_url=f"{base_url}/v1", api_key="unused", max_tokens=MAX_TOKENS,
                     max_retries=0, streaming=stream, stream_usage=True, default_headers=headers,
                     http_async_client=httpx.AsyncClient(transport=log, timeout=120))
    tools = [tool(lookup_city), tool(convert_units)]
    graph = create_react_agent(llm, tools)
    CALLS.clear()
    state = asyncio.run(graph.ainvoke({"messages": [("user", "Weather in Paris, in kelvin?")]},
                                      {"recursion_limit": 25}))
    messages = state["messages"]
    calls = [(c["name"], c["args"]) for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    assert [m.content for m in messages if isinstance(m, ToolMessage)]  # the tools' results went back
    schemas = {t.name: t.tool_call_schema.model_json_schema() for t in tools}
    return calls, str(messages[-1].content), log.rounds, schemas


TOOL_SCHEMAS = {name: function_tool(fn).params_json_schema for name, fn in
                (("lookup_city", lookup_city), ("convert_units", convert_units))}


def check_loop(calls: list, rounds: list, schemas: dict) -> None:
    assert len(calls) == MOCK_TOOL_ROUNDS  # four tool rounds, then the answer
    for name, arguments in calls:
        jsonschema.validate(arguments, schemas[name])
    assert len(rounds) == MOCK_TOOL_ROUNDS + 1
    assert len({r["session"] for r in rounds}) == 1 and len({r["decode"] for r in rounds}) == 1
    assert [int(r["round"]) for r in rounds] == list(range(len(rounds)))
    for before, after in zip(rounds, rounds[1:]):  # the whole previous round is the next's history
        held = before["usage"]["prompt_tokens"] + before["usage"]["completion_tokens"]
        assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == held


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_openai_agents_sdk_agent_runs_its_tool_loop_through_ampd(cluster, stream):
    calls, final, rounds = run_openai_agent(cluster.urls[0], model_name(cluster), stream)
    check_loop(calls, rounds, TOOL_SCHEMAS)
    assert calls[0][0] == "lookup_city" and calls[1][0] == "convert_units"  # tool k mod 2 after k results
    assert final and rounds[-1]["session"].startswith("ampd-")  # found from the prompt: no key was sent
    direct_calls, direct_final, _ = run_openai_agent(decode_url(cluster), model_name(cluster), stream)
    assert (calls, final) == (direct_calls, direct_final)


def test_an_openai_agents_sdk_agent_naming_its_session_keeps_it(cluster):
    calls, _, rounds = run_openai_agent(cluster.urls[0], model_name(cluster), False,
                                        headers={"X-Session-Id": "agent-42"})
    check_loop(calls, rounds, TOOL_SCHEMAS)
    assert rounds[0]["session"] == "agent-42"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_langgraph_agent_runs_its_tool_loop_through_ampd(cluster, stream):
    calls, final, rounds, schemas = run_langgraph_agent(cluster.urls[0], model_name(cluster), stream)
    check_loop(calls, rounds, schemas)
    assert final
    direct_calls, direct_final, _, _ = run_langgraph_agent(decode_url(cluster), model_name(cluster), stream)
    assert (calls, final) == (direct_calls, direct_final)
