"""``profile.json``: what a profile measured, the fit, the engines' fingerprint, and the
performance model every other command loads from it (``--perf-model``).

Layout (``"format": "ampd.profile/1"``):

- ``fingerprint``: each engine's served model, engine and version, KV block size and
  blocks, ``max_model_len``; the TP given; the KV connector seen; seed and grid;
- ``points``: every measured point (``prefill``, ``decode``, ``kv``, ``mixed``,
  ``overhead``, ``remote``, ``neighbour``);
- ``fit_report``: per function, breakpoints, training and held-out MAPE, and what each
  time was measured by (engine counters or the client's clock);
- ``perf_model``: an ``ampd.perf.alphabeta/2`` object (docs/PERF_MODEL.md) with the
  measured KV link, KV capacity, KV bytes per token, batching, request overhead,
  remote path and shared host where measured.
"""

from __future__ import annotations

import dataclasses
import json
import platform
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ampd.perf.catalog import GpuSpec, ModelSpec
from ampd.perf.measured import EngineBatching, Measured, RemotePath, SharedHost
from ampd.perf.model import AlphaBetaPerfModel
from ampd.perf.topology import default_topology
from ampd.profile.run import Measurements, ProfileGrid

FORMAT = "ampd.profile/1"

MEASURED_BY = {
    "prefill": "engine: vllm:request_prefill_time_seconds (one request at a time, history from the prefix cache "
               "checked by usage.prompt_tokens_details.cached_tokens)",
    "decode": "engine: vllm:request_decode_time_seconds of b requests sent together, over their steps",
    "kv": "engine: vllm:nixl_xfer_time_seconds and vllm:nixl_bytes_transferred",
    "batching": "engine: vllm:inter_token_latency_seconds buckets, a batch with a local prefill against one "
                "without",
    "request_overhead": "client: time to the first streamed token of a 16-token prompt, less the engine's "
                        "vllm:time_to_first_token_seconds (median of the probes)",
    "remote": "engine: vllm:time_to_first_token_seconds of each of a remote round's requests made as serving "
              "makes them (history export on the decode engine, prefill reading it, decode engine's join); "
              "the history read checked by the prefill engine's usage.prompt_tokens_details.cached_tokens; "
              "each request's serving path: the client's time to its reply less the engine's (median of the probes)",
    "shared_host": "engine: vllm:request_decode_time_seconds of one decode batch with the prefill engine idle, "
                   "then while it prefills fresh prompts back to back (the medians' ratio, 1 unless every busy "
                   "run was slower than every idle one by 5 % or more)",
}


def profile_document(points: Measurements, fingerprints: dict[str, Any], fits: dict[str, Any], model: ModelSpec,
                     gpu: GpuSpec, tp: int, grid: ProfileGrid, seed: int) -> dict[str, Any]:
    """The JSON object of ``profile.json`` (see the module docstring)."""
    decode_print = fingerprints["decode_engine"]
    report = {name: fits[name].report() for name in ("prefill", "decode")}
    if fits["kv"] is not None:
        report["kv"] = fits["kv"].report()
    report["batching"] = fits["batching"]
    if fits["request_overhead_s"] is not None:
        report["request_overhead_s"] = fits["request_overhead_s"]
    remote = fits["remote"]
    if remote is not None:
        report["remote"] = {name: fit.report() for name, fit in remote.items()}
    shared = fits["shared_host"]
    if shared is not None:
        report["shared_host"] = shared
    report["measured_by"] = dict(MEASURED_BY)
    if grid.serving_load_batch:
        for name in ("request_overhead", "remote"):
            report["measured_by"][name] += (f"; while the decode engine streamed {grid.serving_load_batch} other "
                                            f"sequences, as under serving (ampd.profile.decode_load)")
    blocks, block = decode_print.get("num_gpu_blocks"), decode_print.get("block_size_tokens")
    mode = fits["batching"]["mode"]
    measured = Measured(kv_link=fits["kv"].link if fits["kv"] is not None else None,
                        kv_capacity_tokens={tp: blocks * block} if blocks and block else None,
                        kv_bytes_per_token=fits["kv_bytes_per_token"],
                        batching=None if mode == "unmeasured" else EngineBatching(mode, fits["batching"].get("chunk_tokens")),
                        request_overhead_s=fits["request_overhead_s"],
                        remote_path=None if remote is None else {tp: RemotePath(
                            remote["export"].linear, remote["prefill"].cost, remote["join"].linear,
                            fits["remote_paths_s"])},
                        shared_host=None if shared is None else SharedHost(shared["decode_step_factor"]))
    held_out = {name: report[name]["held_out_mape"] for name in ("prefill", "decode", "kv") if name in report}
    held_out.update({f"remote_{name}": fit["held_out_mape"] for name, fit in report.get("remote", {}).items()})
    perf = AlphaBetaPerfModel(model, gpu, default_topology(gpu), {tp: fits["prefill"].cost}, {tp: fits["decode"].cost},
                              {"source": "ampd profile", "held_out_mape": held_out}, measured)
    return {
        "format": FORMAT,
        "fingerprint": {**fingerprints, "tp": tp, "connector": "nixl" if points.kv else None, "seed": seed,
                        "grid": dataclasses.asdict(grid), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                        "profiler_host": platform.node(), "profiler_machine": platform.machine()},
        "points": points.to_dict(),
        "fit_report": report,
        "perf_model": json.loads(perf.to_json()),
    }


def write(document: dict[str, Any], path: str | Path) -> Path:
    """Write ``document`` as JSON to ``path`` (its folder created); the path.

    Raises:
        ValueError: a NaN or infinity in ``document`` (standard JSON has none, and other
            tools would refuse the file).
    """
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1, allow_nan=False))
    return out
