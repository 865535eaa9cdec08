"""How a decode worker's engine mixes a local prefill with its decode steps, and
what a local prefill costs under it: the one place the simulator's decode worker,
the router's ``t_local`` and the planner's decode side read it from (issue 11,
item 4; docs/SIMULATOR.md, "Engine batching").

Two engine behaviours matter for a prefill run on a decode worker:

- a **pause** (``alternate``, AMPD as published; ``prefill-first``, vLLM V0): the
  prefill runs alone for ``T_pre(hist, new)``; every running sequence's next token
  waits that long on top of its decode step;
- **chunks** (``chunked``, vLLM V1 with ``max_num_batched_tokens``): each step
  decodes one token of each of the b running sequences and prefills up to
  ``chunk_tokens - b`` tokens of the prefill, so the prefill spans
  ``ceil(new / (chunk_tokens - b))`` mixed steps and a running sequence's gaps
  during it are those steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampd.perf.interface import PerfModel
from ampd.perf.measured import BATCHING_MODES


@dataclass(frozen=True, slots=True)
class Batching:
    """How a decode worker mixes local prefills with decode steps.

    - ``alternate`` (AMPD's decode workers, [our choice]: the paper only says a
      local prefill interrupts the batch): at most one local prefill between two
      decode steps, so a long local queue cannot starve the batch;
    - ``prefill-first`` (vLLM V0): every waiting prefill runs before the next
      decode step;
    - ``chunked`` (vLLM V1 chunked prefill): each step decodes one token of every
      running sequence and prefills up to ``chunk_tokens`` minus the batch size
      tokens of the head prefill task.

    ``chunk_tokens`` defaults to 2048, vLLM's serving default of
    ``max_num_batched_tokens``.

    Raises:
        ValueError: unknown mode, or a chunk budget below 1.
    """

    mode: str = "alternate"
    chunk_tokens: int = 2048

    def __post_init__(self) -> None:
        if self.mode not in BATCHING_MODES:
            raise ValueError(f"unknown batching {self.mode!r}; known: {', '.join(BATCHING_MODES)}")
        if self.chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {self.chunk_tokens}")

    @property
    def chunked(self) -> bool:
        """True when prefills run in chunks mixed into decode steps."""
        return self.mode == "chunked"

    def chunk(self, left_tokens: int, batch_size: int) -> int:
        """Prefill tokens the next mixed step carries: what is left of the task,
        within the budget the ``batch_size`` decoding sequences leave (one token
        each); 0 when they take the whole budget (the prefill waits)."""
        return max(0, min(left_tokens, self.chunk_tokens - batch_size))


def measured_batching(perf: PerfModel) -> Batching | None:
    """The batching a profiled performance model measured on the real engine (its
    ``batching``, an ``ampd.perf.measured.EngineBatching``), or None when it has none
    (a catalog model). A pause has no budget of its own; ``Batching``'s default stands
    in, unused by those modes.

    Raises:
        ValueError: a measured mode or budget ``Batching`` refuses.
    """
    measured = getattr(perf, "batching", None)  # PerfModels other than AlphaBetaPerfModel measure none
    if measured is None:
        return None
    return Batching(measured.mode, measured.chunk_tokens or Batching().chunk_tokens)


def mixed_step_s(perf: PerfModel, tp: int, prefilled_tokens: int, chunk_tokens: int, batch_size: int,
                 context_tokens: int) -> float:
    """One chunked step, seconds: ``chunk_tokens`` prefill tokens on top of
    ``prefilled_tokens`` already in the KV cache, plus one decode token of each of
    ``batch_size`` sequences holding ``context_tokens`` of KV.

    ``T_pre(prefilled, chunk) + T_dec(b, ctx) - T_dec(1, 0)``: the chunk plus what
    the decode batch adds beyond a one-token step, the weights being read once
    per step. [our choice] (docs/SIMULATOR.md, colocated baselines): the paper has
    no mixed step; a profile measures it (issue 11). No batch: the chunk alone.
    """
    prefill_s = perf.prefill_s(prefilled_tokens, chunk_tokens, tp)
    if batch_size == 0:
        return prefill_s
    return prefill_s + (perf.decode_step_s(batch_size, context_tokens, tp) - perf.decode_step_s(1, 0, tp))


@dataclass(frozen=True, slots=True)
class LocalPrefill:
    """What one local prefill does on a decode worker.

    Attributes:
        ttft_s: from its start to its first token, seconds (math.inf when chunked
            steps leave it no room: the batch takes the whole token budget).
        added_s: for each token gap of a running sequence the prefill touches, the
            seconds it adds beyond a plain decode step of the batch: one gap of
            ``T_pre`` for a pause; one per mixed step for chunks. Empty when no
            sequence is running or the prefill cannot start.
    """

    ttft_s: float
    added_s: tuple[float, ...]

    @property
    def delay_s(self) -> float:
        """Seconds the prefill adds to the running batch in all: the share of the
        worker's time its decode steps lose to it."""
        return sum(self.added_s)


def local_prefill(perf: PerfModel, tp: int, batching: Batching, hist_tokens: int, new_tokens: int,
                  batch_size: int, context_tokens: int) -> LocalPrefill:
    """A prefill of ``new_tokens`` on ``hist_tokens`` of history, started now on a
    decode worker of ``tp`` GPUs whose ``batch_size`` running sequences hold
    ``context_tokens`` of KV (module docstring).

    [our choice] The batch keeps its size while the prefill runs (sequences that
    join or finish meanwhile are not foreseen, as the paper's ``t_local`` leaves
    the decode steps out); under chunks, its context grows by one token per
    sequence and step, as the simulator's does.
    """
    if not batching.chunked:
        prefill_s = perf.prefill_s(hist_tokens, new_tokens, tp)
        return LocalPrefill(prefill_s, (prefill_s,) if batch_size else ())
    if batch_size >= batching.chunk_tokens:
        return LocalPrefill(float("inf"), ())
    steps_s, added_s, done = [], [], 0
    while done < new_tokens:
        chunk = batching.chunk(new_tokens - done, batch_size)
        step_s = mixed_step_s(perf, tp, hist_tokens + done, chunk, batch_size, context_tokens)
        steps_s.append(step_s)
        if batch_size:
            added_s.append(step_s - perf.decode_step_s(batch_size, context_tokens, tp))
        done += chunk
        context_tokens += batch_size
    return LocalPrefill(sum(steps_s), tuple(added_s))
