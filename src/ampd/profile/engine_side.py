"""Where a sim-vs-real gap lies: the engines' own counters over a real run, set against
the simulator and the client (``ampd validate``, docs/PROFILING.md "Sim vs real").

An end-to-end TTFT or ITL seen by the client includes everything between the engine
and the client (the engine's API server, the coordinator's relay, the client itself);
the simulator models the engines' requests, and the coordinator and the client by the
means of a calibration (``ampd.perf.measured.ServingStack``). Scraping each engine's ``/metrics`` before
and after a real run splits the two:

- **ITL** three ways: the simulator's, the decode engines' (``vllm:inter_token_latency_seconds``,
  timed where the engine emits each token), the client's; all token-weighted (every
  gap counts once), as the engine's histogram is;
- **remote prefills**: the prefill engines' ``vllm:request_prefill_time_seconds``
  against the profile's ``T_pre`` of the same rounds as the engine computed them (a
  history read computes the new tokens on top of the history; a shorter history than
  the engines' recompute threshold is computed again): the cost model checked on the
  run's own work under serving load, where the profile measured one probe at a time;
  and the simulator's three stages of the same rounds (``perf.remote_stages_s``: with a
  measured remote path, no read, the export and the prefill engine's request, and the
  join, each with its serving path, to set beside the coordinator's ``export`` + ``prefill`` and ``first_token``
  phases);
- **KV transfers**: the engines' ``vllm:nixl_xfer_time_seconds`` (mean, count),
  which the profile times one at a time on idle engines;
- **TTFT** by stage (the client's and the simulator's means are ``compare``'s): per
  engine role the engines' ``vllm:time_to_first_token_seconds`` (from the request's arrival at the
  engine's API server to its first token) with the part of it spent queued
  (``vllm:request_queue_time_seconds``: waiting for a step, and for a KV read). A
  remote round's TTFT is its prefill engine's plus its decode engine's plus the path
  between them (the coordinator, HTTP); a local round's, its decode engine's plus
  the path. Beside them the profile's serving path of the same rounds (a local round's
  one engine request at ``perf.request_overhead_s``; a remote round's prefill request
  and join, and a measured remote path's history export, at
  ``perf.remote_request_paths_s``), which the simulator counts (the serving stack's
  share is not in it);
- **the coordinator's phases** (``coordinator_phases``): each coordinator's
  ``ampd_round_phase_seconds`` (``ampd.serve.rounds.phases``) over the run, the mean
  of each phase per route: where the rest of a TTFT lies.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import httpx

from ampd.core.deployment import Role, WorkerSpec
from ampd.metrics.records import SessionRecord
from ampd.perf.interface import PerfModel
from ampd.profile.scrape import (
    INTER_TOKEN_LATENCY,
    KV_XFER_TIME,
    PREFILL_TIME,
    QUEUE_TIME,
    TIME_TO_FIRST_TOKEN,
    Snapshot,
    delta,
    scrape,
    series,
)
from ampd.serve.rounds.phases import PHASES

ROUND_PHASE = "ampd_round_phase_seconds"


async def snapshot_engines(urls: Sequence[str]) -> list[Snapshot]:
    """One ``/metrics`` scrape of each engine, in order.

    Raises:
        ProbeError: an engine is unreachable.
    """
    async with httpx.AsyncClient(timeout=30.0) as client:
        return [await scrape(client, url) for url in urls]


def _gained(before: Sequence[Snapshot], after: Sequence[Snapshot], histogram: str) -> tuple[float, float]:
    """(sum, count) ``histogram`` gained over the engines."""
    deltas = [delta(b, a, histogram) for b, a in zip(before, after)]
    return sum(d.sum for d in deltas), sum(d.count for d in deltas)


def _mean(total: float, count: float) -> float | None:
    return total / count if count else None


def _token_itl_s(sessions: Sequence[SessionRecord]) -> float | None:
    """Mean gap between two tokens over every gap of every round (token-weighted)."""
    total = sum(r.itls_s.sum_s for s in sessions for r in s.rounds)
    count = sum(len(r.itls_s) for s in sessions for r in s.rounds)
    return _mean(total, count)


def engine_side(roles: Sequence[str], before: Sequence[Snapshot], after: Sequence[Snapshot],
                real: Sequence[SessionRecord], sim: Sequence[SessionRecord], perf: PerfModel, prefill_tp: int,
                history_read_min_tokens: int | None) -> dict[str, float | int | None]:
    """The engine-side figures of one real run (see the module docstring).

    Args:
        roles: each engine's role (``prefill``, ``decode``), in the order of ``before``
            and ``after``.
        before, after: each engine's scrape before and after the run.
        real, sim: the sessions the real run and the simulator ran.
        perf: the profile the simulator ran on.
        prefill_tp: the prefill engines' TP degree.
        history_read_min_tokens: the engines' ``kv_recompute_threshold`` when their
            prefill engines read history (``vllm-nixl``, mock engines: 0); None when
            they recompute it (``vllm``).

    Returns:
        ``itl_sim_s``, ``itl_engine_s``, ``itl_client_s`` (means, seconds);
        ``remote_prefill_model_s`` and ``remote_prefill_engine_s`` (means, seconds);
        ``remote_read_model_s``, ``remote_compute_model_s``, ``remote_send_model_s``
        (the simulator's stages of the same rounds, means, seconds); with ``remote_rounds`` (rounds the real run prefilled remotely) and
        ``remote_prefills_engine`` (prefills the prefill engines counted);
        ``kv_xfer_engine_s`` (mean, seconds) and ``kv_xfers_engine`` (count);
        for each role R, ``ttft_R_engine_s`` and ``queue_R_engine_s`` (the engines' means,
        seconds); ``serving_path_model_s`` (the profile's, mean over the real run's
        rounds, seconds). A mean with nothing to average is None.
    """
    def of(role: str) -> tuple[list[Snapshot], list[Snapshot]]:
        pairs = [(b, a) for r, b, a in zip(roles, before, after) if r == role]
        return [b for b, _ in pairs], [a for _, a in pairs]

    decode_before, decode_after = of("decode")
    prefill_before, prefill_after = of("prefill")
    served = [r for s in real for r in s.rounds if r.first_token_s is not None]
    remote = [r for r in served if r.local is False]
    computed = [_computed(r.hist_tokens, r.new_tokens, history_read_min_tokens) for r in remote]
    model_s = [perf.prefill_s(*c, prefill_tp) for c in computed]
    # The profile's engines were one of each role at one TP, on one host.
    specs = WorkerSpec(0, Role.PREFILL, prefill_tp, 0), WorkerSpec(1, Role.DECODE, prefill_tp, 0)
    stages = [perf.remote_stages_s(*c, *specs) for c in computed]
    # A measured remote path makes a third request, the history export, of rounds with history.
    exports = sum(cached > 0 for cached, _ in computed) if perf.measured_remote_path(prefill_tp) else 0
    paths = perf.remote_request_paths_s(prefill_tp)
    prefill_sum_s, prefill_count = _gained(prefill_before, prefill_after, PREFILL_TIME)
    xfer_sum_s, xfer_count = _gained(before, after, KV_XFER_TIME)
    return {
        "itl_sim_s": _token_itl_s(sim),
        "itl_engine_s": _mean(*_gained(decode_before, decode_after, INTER_TOKEN_LATENCY)),
        "itl_client_s": _token_itl_s(real),
        "remote_prefill_model_s": statistics.fmean(model_s) if model_s else None,
        "remote_prefill_engine_s": _mean(prefill_sum_s, prefill_count),
        **{f"remote_{name}_model_s": statistics.fmean(getattr(st, f"{name}_s") for st in stages) if stages else None
           for name in ("read", "compute", "send")},
        "remote_rounds": len(remote), "remote_prefills_engine": int(prefill_count),
        "kv_xfer_engine_s": _mean(xfer_sum_s, xfer_count), "kv_xfers_engine": int(xfer_count),
        "serving_path_model_s": _mean((len(served) - len(remote)) * perf.request_overhead_s
                                      + len(remote) * (paths.prefill + paths.join) + exports * paths.export, len(served)),
        **{f"{what}_{role}_engine_s": _mean(*_gained(*of(role), histogram))
           for role in ("prefill", "decode") for what, histogram in (("ttft", TIME_TO_FIRST_TOKEN),
                                                                     ("queue", QUEUE_TIME))},
    }


def _computed(hist_tokens: int, new_tokens: int, history_read_min_tokens: int | None) -> tuple[int, int]:
    """``(cached, computed)`` tokens of a remote prefill as the prefill engine runs it:
    the history read (cached) unless the engine recomputes it, or it is shorter than
    the read threshold."""
    if history_read_min_tokens is None or 0 < hist_tokens < history_read_min_tokens:
        return 0, hist_tokens + new_tokens
    return hist_tokens, new_tokens


def coordinator_phases(before: Sequence[Snapshot], after: Sequence[Snapshot]) -> dict[str, dict[str, float | int]]:
    """Per route label (``ampd.serve.rounds.phases.PHASES``) with rounds in the run: the
    mean of each phase over the coordinators' rounds, seconds, and ``rounds``.

    Args:
        before, after: each coordinator's scrape before and after the run.
    """
    phases: dict[str, dict[str, float | int]] = {}
    for route, names in PHASES.items():
        gained = {name: _gained(before, after, series(ROUND_PHASE, phase=name, route=route)) for name in names}
        count = gained[names[0]][1]
        if count:
            phases[route] = {"rounds": int(count), **{f"{name}_s": total / count for name, (total, _) in gained.items()}}
    return phases
