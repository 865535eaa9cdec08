"""Sweeps: systems x workloads x rates, each point one simulation, run on every
core. Thresholds are resolved once per workload (from its sessions at the
lowest rate) so every system and rate of that workload is judged alike; an
``auto`` deployment once per workload and system (``_planned``)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from concurrent.futures import ProcessPoolExecutor

from tqdm import tqdm

from ampd.config import RunConfig, SweepConfig, override
from ampd.core.errors import InputError
from ampd.experiment import perf_model_for, sessions_for, simulate, slo_for
from ampd.planning import resolve_deployment
from ampd.workload import WORKLOADS


def workload_source(text: str) -> dict:
    """The ``workload`` fields for a command-line workload: a synthetic name
    (``toolbench``), a shipped trace (``builtin:mooncake-conversation``) or a file."""
    if not text.strip():
        raise InputError("workload: empty name; give a synthetic workload, builtin:<trace> or a file")
    if text.lower() in WORKLOADS:
        return {"name": text.lower(), "trace": None, "trace_format": None}
    return {"name": None, "trace": text}


def resolve_slo(config: RunConfig) -> RunConfig:
    """``config`` with both thresholds set (derived where missing)."""
    slo = slo_for(config, perf_model_for(config), sessions_for(config))
    return override(config, slo={"ttft_s": slo.ttft_s, "itl_s": slo.itl_s})


def resolve(config: RunConfig) -> RunConfig:
    """``config`` ready to run and to save: thresholds and deployment explicit."""
    return resolve_deployment(resolve_slo(config))


def _planned(config: RunConfig, rates_per_s: Sequence[float]) -> RunConfig:
    """``config`` with an ``auto`` deployment planned once for the sweep's load:
    [our choice] at the median rate, or at the next lower rate where the planner
    finds a feasible plan (an overloaded rate has none)."""
    ordered = sorted(rates_per_s)
    candidates = ordered[: len(ordered) // 2 + 1][::-1]
    for rate in candidates[:-1]:
        try:
            return resolve_deployment(override(config, workload={"rate_per_s": rate}))
        except InputError:
            continue
    return resolve_deployment(override(config, workload={"rate_per_s": candidates[-1]}))


def plan_sweep(base: RunConfig, sweep: SweepConfig) -> list[RunConfig]:
    """Every point's full configuration, thresholds resolved per workload.

    Raises:
        InputError: an invalid system, workload or rate.
    """
    configs = []
    for w in sweep.workloads:
        extra = {k: v for k, v in (("arrivals", w.arrivals), ("num_sessions", w.num_sessions)) if v is not None}
        first = override(base, workload={**workload_source(w.workload), **extra, "rate_per_s": min(w.rates_per_s)})
        resolved = resolve_slo(first)
        for system in sweep.systems:
            cluster = {"deployment": sweep.deployments[system]} if system in sweep.deployments else {}
            planned = _planned(override(resolved, system=system, cluster=cluster), w.rates_per_s)
            for rate in w.rates_per_s:
                configs.append(override(planned, workload={"rate_per_s": rate}))
    return configs


def _point(config: RunConfig) -> dict:
    out = simulate(config)
    return {"system": config.system, "workload": config.workload.label, "rate_per_s": config.workload.rate_per_s,
            "model": config.cluster.model, "num_gpus": config.cluster.num_gpus,
            "deployment": config.cluster.deployment, "ttft_slo_s": out.slo.ttft_s, "itl_slo_s": out.slo.itl_s,
            "num_events": out.result.num_events, **out.summary.to_dict()}


@functools.cache
def _code_digest() -> str:
    """A digest of the package's sources: a cached point is reused only by the code
    that produced it."""
    sha = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parent.rglob("*.py")):
        sha.update(path.read_bytes())
    return sha.hexdigest()


def _cache_path(cache_dir: Path, config: RunConfig) -> Path:
    digest = hashlib.sha256((_code_digest() + config.model_dump_json()).encode()).hexdigest()[:20]
    return cache_dir / f"{digest}.json"


def _cached_point(config: RunConfig, cache_dir: Path | None) -> dict:
    """``_point``, read from ``cache_dir`` when this exact configuration ran before;
    written there (atomically) when it runs, so an interrupted sweep resumes."""
    if cache_dir is None:
        return _point(config)
    path = _cache_path(cache_dir, config)
    if path.exists():
        return json.loads(path.read_text())["row"]
    row = _point(config)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"config": config.model_dump(mode="json"), "row": row}))
    tmp.replace(path)
    return row


def run_sweep(configs: Sequence[RunConfig], jobs: int | None = None, progress: bool = True,
              cache_dir: Path | None = None) -> list[dict]:
    """Simulate every configuration, ``jobs`` at a time (default: every core).
    Rows come back in the order of ``configs``. With ``cache_dir``, points that
    ran before, with the same configuration and the same code, are read back
    instead of simulated again."""
    jobs = jobs or os.cpu_count() or 1
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(configs), desc="simulating", unit="run", disable=not progress)
    if jobs == 1:
        rows = []
        for c in configs:
            rows.append(_cached_point(c, cache_dir))
            bar.update()
    else:
        with ProcessPoolExecutor(jobs) as pool:
            futures = [pool.submit(_cached_point, c, cache_dir) for c in configs]
            for f in futures:
                f.add_done_callback(lambda _: bar.update())
            rows = [f.result() for f in futures]
    bar.close()
    return rows
