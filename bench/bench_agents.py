"""Agents through the coordinator, on mock engines and a real Redis server.

1. Coordinator overhead per round, chat with tools against plain completions:
   the same engine called directly and through the coordinator (a colocated
   system: every prefill local), rounds one at a time on fresh sessions, the two
   paths alternating; the medians' difference of TTFT is the overhead. The chat
   round carries two tools and ``tool_choice: required`` (the mock answers a
   tool call, ~60 tokens); the completion a token-id prompt of the chat's length
   and as many output tokens.
2. Agent rounds per second: OpenAI Agents SDK agents (5 rounds each: 4 tool
   calls, then the answer), ``CONCURRENT`` at a time in a closed loop, through
   the documented mock cluster (configs/serve_mock.toml); two batches one after
   the other, each figure its own, so that a rate that moved with the run's
   length would show.

Run: ``python bench/bench_agents.py`` -> ``bench/results/agents.json``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
from common import stream_round, write_result  # noqa: E402

from ampd.config import RunConfig, load_config, override  # noqa: E402
from ampd.engines.mock.chat import MOCK_TOOL_ROUNDS  # noqa: E402
from ampd.cluster.up import LocalCluster, free_serve_ports  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 40
CONCURRENT, BATCHES = 8, 2
CLUSTER = {"model": "Llama-3.1-8B", "gpu": "H100-SXM", "num_gpus": 1, "deployment": "D:<TP=1,DP=1>"}
TOOLS = [{"type": "function", "function": {"name": name, "description": "a tool", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}} for name in ("lookup_city", "forecast")]
MESSAGES = [{"role": "system", "content": "You are an agent. " * 20}, {"role": "user", "content": "Weather?"}]


async def _overhead(coordinator: str, engine: str) -> dict:
    model = CLUSTER["model"]
    async with httpx.AsyncClient(timeout=60) as client:
        rendered = (await client.post(f"{engine}/tokenize", json={"messages": MESSAGES, "tools": TOOLS})).json()
        chat = {"model": model, "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required", "max_tokens": 128,
                "stream": True, "return_token_ids": True}
        _, _, call_tokens = await stream_round(client, engine, "/v1/chat/completions", chat, uuid.uuid4().hex)
        completion = {"model": model, "prompt": [5 + i % 90 for i in range(rendered["count"])],
                      "max_tokens": call_tokens, "stream": True, "return_token_ids": True}
        figures = {}
        for kind, path, body in (("chat_with_tools", "/v1/chat/completions", chat),
                                 ("completions", "/v1/completions", completion)):
            direct, through = [], []
            for _ in range(ROUNDS):
                direct.append((await stream_round(client, engine, path, body, uuid.uuid4().hex))[0])
                through.append((await stream_round(client, coordinator, path, body, uuid.uuid4().hex))[0])
            figures[kind] = {"rounds": ROUNDS, "prompt_tokens": rendered["count"], "output_tokens": call_tokens,
                             "ttft_direct_median_ms": 1e3 * statistics.median(direct),
                             "ttft_coordinator_median_ms": 1e3 * statistics.median(through),
                             "overhead_median_ms": 1e3 * (statistics.median(through) - statistics.median(direct))}
    return figures


def _agent_rates(url: str, model: str) -> list[dict]:
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    def lookup_city(city: str, days: int) -> str:
        """Weather of a city."""
        return f"{city}: sunny for {days} days"

    async def batch() -> dict:
        client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        agent = Agent(name="weather", instructions="Use the tools.", tools=[function_tool(lookup_city)],
                      model=OpenAIChatCompletionsModel(model=model, openai_client=client),
                      model_settings=ModelSettings(max_tokens=128))
        start = time.perf_counter()
        results = await asyncio.gather(*(Runner.run(agent, f"Weather in city {i}?", max_turns=10)
                                         for i in range(CONCURRENT)))
        wall_s = time.perf_counter() - start
        await client.close()
        rounds = sum(len(r.raw_responses) for r in results)
        return {"agents": CONCURRENT, "rounds": rounds, "wall_s": wall_s, "rounds_per_s": rounds / wall_s}
    return [asyncio.run(batch()) for _ in range(BATCHES)]


def main() -> None:
    with tempfile.TemporaryDirectory() as scratch:
        config = RunConfig(system="vllm", cluster=CLUSTER, workload={"name": "toolbench", "num_sessions": 5},
                           serve=free_serve_ports())
        with LocalCluster(config, Path(scratch) / "overhead") as cluster:
            engine = next(child.health_url for child in cluster.engines.values())
            overhead = asyncio.run(_overhead(cluster.urls[0], engine))
        mock, _ = load_config(ROOT / "configs" / "serve_mock.toml")
        with LocalCluster(override(mock, serve=free_serve_ports(coordinators=1)), Path(scratch) / "agents") as cluster:
            rates = _agent_rates(cluster.urls[0], mock.cluster.model)
    for kind, row in overhead.items():
        print(f"{kind}: TTFT direct {row['ttft_direct_median_ms']:.1f} ms, through ampd "
              f"{row['ttft_coordinator_median_ms']:.1f} ms (+{row['overhead_median_ms']:.1f} ms)")
    for row in rates:
        print(f"{row['agents']} agents, {row['rounds']} rounds in {row['wall_s']:.1f} s: "
              f"{row['rounds_per_s']:.2f} rounds/s")
    write_result("agents", {
        "overhead": overhead,
        "overhead_setup": {"cluster": CLUSTER, "system": "vllm (colocated: every prefill local)",
                           "store": "redis", "note": "medians over rounds one at a time, direct and through the "
                                                     "coordinator alternating, each on a fresh session"},
        "agents": rates,
        "agents_setup": {"config": "configs/serve_mock.toml", "framework": "openai-agents",
                         "rounds_per_agent": MOCK_TOOL_ROUNDS + 1, "closed_loop_concurrency": CONCURRENT},
    })


if __name__ == "__main__":
    main()
