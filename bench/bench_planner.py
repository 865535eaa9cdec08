"""Planning time at 8, 16, 32, 64, 128 and 256 GPUs against the paper's (AMPD.md
section 2: 0.54, 1.93, 5.06, 14.50, 28.88, 61.67 s).

Workload: ToolBench-like on Llama-3.1-70B / H20, the load scaled with the cluster:
``RATE_PER_8`` sessions/s and ``SESSIONS_PER_GPU`` x N sessions (so the nominal stream
spans the same time at every size). Timed separately: the tau table (``estimate_tau``)
and the top-3 solve (three SCIP solves with no-good cuts); scipy's ``milp`` is timed on
the same table as the cross-check. Also timed: the planner co-designed with AMPD's
adaptive routing (what ``ampd plan`` runs for AMPD's systems; ``ampd.planner.codesign``):
its stream and routed prefill side, the decode side rebuilt per visit, and the SCIP
solves, top 3, alpha the paper's 0.9; and the same with mixed degrees on the decode side
(``[planner] mixed_degrees``: docs/PLANNER.md, "Mixed degrees"), with its binaries in
the first visit's ILP. Each figure is the median of ``REPEATS`` runs.

Run: ``python bench/bench_planner.py`` -> ``bench/results/planner.json``.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result  # noqa: E402

from ampd.perf import build_perf_model  # noqa: E402
from ampd.planner import build_ilp, estimate_tau, top_plans  # noqa: E402
from ampd.planner.codesign import co_designed_plans  # noqa: E402
from ampd.planner.tau import tau_sides  # noqa: E402
from ampd.policy.systems import Knobs  # noqa: E402
from ampd.run.slo_rule import derive_slo  # noqa: E402
from ampd.workload import generate  # noqa: E402

PAPER_S = {8: 0.54, 16: 1.93, 32: 5.06, 64: 14.50, 128: 28.88, 256: 61.67}
MODEL, GPU, WORKLOAD = "Llama-3.1-70B", "H20", "toolbench"
RATE_PER_8 = 1.3
SESSIONS_PER_GPU = 25
REPEATS = 3


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def one_size(num_gpus: int) -> dict:
    """Median tau and solve times at ``num_gpus`` GPUs, with the plans and solver status."""
    perf = build_perf_model(MODEL, GPU)
    sessions = generate(WORKLOAD, SESSIONS_PER_GPU * num_gpus, RATE_PER_8 * num_gpus / 8, np.random.default_rng(0))
    slo = derive_slo(perf, sessions)
    tau_s, scip_s, milp_s, codesign_s, mixed_s = [], [], [], [], []
    for _ in range(REPEATS):
        design, seconds = _timed(lambda: co_designed_plans(tau_sides(sessions, perf, slo, num_gpus, local_share=0.0),
                                                           Knobs().alpha, 3))
        codesign_s.append(seconds)
        mixed, seconds = _timed(lambda: co_designed_plans(
            tau_sides(sessions, perf, slo, num_gpus, local_share=0.0, mixed_degrees=True), Knobs().alpha, 3))
        mixed_s.append(seconds)
        table, seconds = _timed(lambda: estimate_tau(sessions, perf, slo, num_gpus))
        tau_s.append(seconds)
        plans, seconds = _timed(lambda: top_plans(table, 3, "scip"))
        scip_s.append(seconds)
        cross, seconds = _timed(lambda: top_plans(table, 3, "milp"))
        milp_s.append(seconds)
    ilp = build_ilp(table)
    total_s = statistics.median(tau_s) + statistics.median(scip_s)
    return {"num_gpus": num_gpus, "num_sessions": len(sessions), "rate_per_s": RATE_PER_8 * num_gpus / 8,
            "tau_s": statistics.median(tau_s), "solve_scip_s": statistics.median(scip_s),
            "solve_milp_s": statistics.median(milp_s), "total_s": total_s, "paper_s": PAPER_S[num_gpus],
            "speedup": PAPER_S[num_gpus] / total_s, "binaries": len(ilp.cells), "rows": int(ilp.matrix.shape[0]),
            "status": [p.status for p in plans], "milp_agrees": [str(p.deployment) for p in plans] ==
            [str(p.deployment) for p in cross],
            "plans": [{"deployment": str(p.deployment), "objective": p.objective} for p in plans],
            "codesign_s": statistics.median(codesign_s), "codesign_visits": len(design.visits),
            "codesign_status": [p.status for p in design.plans],
            "codesign_plans": [{"deployment": str(p.deployment), "objective": p.objective,
                                "local_share": p.prefill.local_share} for p in design.plans],
            "codesign_mixed_s": statistics.median(mixed_s), "codesign_mixed_visits": len(mixed.visits),
            "codesign_mixed_binaries": len(build_ilp(mixed.bound).cells),
            "codesign_mixed_plans": [{"deployment": str(p.deployment), "objective": p.objective}
                                     for p in mixed.plans]}


def main() -> None:
    rows = []
    for num_gpus in PAPER_S:
        rows.append(one_size(num_gpus))
        r = rows[-1]
        print(f"{num_gpus:4d} GPUs: tau {r['tau_s']:.3f} s + SCIP top-3 {r['solve_scip_s']:.3f} s = {r['total_s']:.3f} s "
              f"(paper {r['paper_s']} s, {r['speedup']:.0f}x); milp {r['solve_milp_s']:.3f} s; "
              f"{r['binaries']} binaries; {r['status']}; best {r['plans'][0]['deployment']}; co-designed "
              f"{r['codesign_s']:.3f} s, {r['codesign_visits']} visits, best {r['codesign_plans'][0]['deployment']}; "
              f"mixed degrees {r['codesign_mixed_s']:.3f} s, {r['codesign_mixed_binaries']} binaries, best "
              f"{r['codesign_mixed_plans'][0]['deployment']}",
              flush=True)
    write_result("planner", {"model": MODEL, "gpu": GPU, "workload": WORKLOAD, "rate_per_8_gpus": RATE_PER_8,
                             "sessions_per_gpu": SESSIONS_PER_GPU, "repeats": REPEATS, "sizes": rows})


if __name__ == "__main__":
    main()
