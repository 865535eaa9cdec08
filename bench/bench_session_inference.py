"""Cost of finding sessions from the prompt (``ampd.serve.state.prompt_index``) with the
index in a real Redis server: wall time per request of the lookup a request
naming no session pays before binding (hash the prompt's blocks, read every key
they name in one round trip, check the entries found), and of filing the
history at the round's end, at 1k and 32k prompt tokens, with 1,000 live
sessions sharing a 1,000-token system prompt (at 1k: half their history); and
the index's memory per 1,000 live sessions (Redis ``MEMORY USAGE`` of its two
hashes, and the server's ``used_memory`` before and after filing), gone again
once the sessions end.

Run: ``python bench/bench_session_inference.py`` -> ``bench/results/session_inference.json``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from ampd.serve.state.prompt_index import HistoryIndex, chain_hashes, token_bytes  # noqa: E402
from ampd.cluster.redis_server import RedisProcess  # noqa: E402
from ampd.serve.state.redis_store import RedisStore  # noqa: E402
from ampd.serve.state.store import SessionState  # noqa: E402
from ampd.cluster.up import free_port_block  # noqa: E402

# (prompt tokens, block tokens): serve.session_block_tokens' default 16 at both sizes, and a
# coarser block at 32k (a quarter of the keys to hash and read).
CASES = ((1024, 16), (32768, 16), (32768, 64))
LIVE_SESSIONS = 1000
LOOKUPS = 400  # per prompt size and outcome
SYSTEM_TOKENS = 1000
OUTPUT_TOKENS, NEW_TOKENS = 16, 48  # a later round: the history, its output, a new input
VOCAB = 32000


def _percentiles_ms(samples_s: list[float]) -> dict:
    ordered = sorted(samples_s)
    return {"median_ms": round(statistics.median(ordered) * 1e3, 4),
            "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))] * 1e3, 4)}


async def _timed(calls) -> list[float]:
    samples = []
    for call in calls:
        start = time.perf_counter()
        await call()
        samples.append(time.perf_counter() - start)
    return samples


async def _one_size(url: str, prompt_tokens: int, block_tokens: int, rng: np.random.Generator) -> dict:
    """1,000 live sessions whose last prompts are ``prompt_tokens`` - 64 tokens
    long; lookups of their next prompts (hits) and of new conversations (misses)."""
    store = RedisStore(url, prefix=f"bench{prompt_tokens}-{block_tokens}:", timeout_s=30.0)
    index = HistoryIndex(store, block_tokens)
    def tokens(n: int) -> list[int]:
        return rng.integers(0, VOCAB, n).tolist()
    history_tokens = prompt_tokens - OUTPUT_TOKENS - NEW_TOKENS
    system_tokens = min(SYSTEM_TOKENS, history_tokens // 2)  # 1k prompts: half of the history is shared
    system = tokens(system_tokens)
    sessions = {}
    for i in range(LIVE_SESSIONS):
        sid = f"ampd-{i:032x}"
        prompt = system + tokens(history_tokens - system_tokens)
        sessions[sid] = (prompt, tokens(OUTPUT_TOKENS))
        await store.bind_session(sid, SessionState(1, 0, prompt_tokens, 1, 1.0), 10**12, "l", 5.0)
        await store.close_round(sid, "l", SessionState(1, prompt_tokens, prompt_tokens, 1, 1.0), 1)
    redis = store._redis  # the benchmark reads the server's own memory accounting
    before = (await redis.info("memory"))["used_memory"]
    record_s = await _timed([lambda sid=sid, p=p, o=o: index.record(sid, "", p, o, 0)
                             for sid, (p, o) in sessions.items()])
    after = (await redis.info("memory"))["used_memory"]
    usage_bytes = sum([await redis.memory_usage(store._k(name), samples=0) for name in ("hidx", "hses")])
    chosen = [f"ampd-{i:032x}" for i in rng.choice(LIVE_SESSIONS, LOOKUPS, replace=False)]
    nexts = [(sid, sessions[sid][0] + sessions[sid][1] + tokens(NEW_TOKENS))
             for sid in chosen]
    found = []

    async def hit(sid, prompt):
        match = await index.find(prompt, "")
        found.append(match is not None and match.session_id == sid and match.matched_tokens == history_tokens +
                     OUTPUT_TOKENS)
    hit_s = await _timed([lambda sid=sid, p=p: hit(sid, p) for sid, p in nexts])
    fresh = [system + tokens(prompt_tokens - system_tokens) for _ in range(LOOKUPS)]
    misses = []

    async def miss(prompt):
        misses.append(await index.find(prompt, "") is None)
    miss_s = await _timed([lambda p=p: miss(p) for p in fresh])
    hash_s = [0.0] * LOOKUPS
    for i, (_, prompt) in enumerate(nexts):
        start = time.perf_counter()
        chain_hashes(token_bytes(prompt), block_tokens, "")
        hash_s[i] = time.perf_counter() - start
    ended = await store.expire_sessions(idle_before_s=2.0)
    left = await redis.hlen(store._k("hidx")) + await redis.hlen(store._k("hses"))
    await store.close()
    assert all(found) and all(misses) and len(ended) == LIVE_SESSIONS and left == 0
    return {"prompt_tokens": prompt_tokens, "block_tokens": block_tokens, "shared_prefix_tokens": system_tokens,
            "lookup_hit": _percentiles_ms(hit_s), "lookup_miss": _percentiles_ms(miss_s),
            "of_which_hashing": _percentiles_ms(hash_s), "record_at_round_end": _percentiles_ms(record_s),
            "index_bytes_per_1000_sessions_memory_usage": round(usage_bytes * 1000 / LIVE_SESSIONS),
            "index_bytes_per_1000_sessions_used_memory_delta": round((after - before) * 1000 / LIVE_SESSIONS),
            "index_fields_left_after_the_sessions_expired": left}


async def main() -> None:
    rng = np.random.default_rng(13)
    with RedisProcess(free_port_block(1)) as server:
        rows = [await _one_size(server.url, n, block, rng) for n, block in CASES]
    for row in rows:
        print(f"{row['prompt_tokens']:>6} tokens, blocks of {row['block_tokens']}: lookup hit {row['lookup_hit']}, miss {row['lookup_miss']}, "
              f"hashing {row['of_which_hashing']}, record {row['record_at_round_end']}, "
              f"index {row['index_bytes_per_1000_sessions_memory_usage']} B / 1,000 sessions")
    write_result("session_inference", {
        "setup": {"live_sessions": LIVE_SESSIONS, "lookups_per_case": LOOKUPS,
                  "shared_prefix": f"every prompt starts with the same {SYSTEM_TOKENS} tokens (at 1k: half "
                  "its history)", "hit": "the next round of a live session "
                  "(history + 16 output + 48 new tokens)", "miss": "a new conversation with the shared system "
                  "prompt", "store": "Redis, one local server (loopback round trip)"},
        "sizes": rows})


if __name__ == "__main__":
    asyncio.run(main())
