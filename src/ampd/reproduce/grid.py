"""What ``ampd reproduce`` runs: the paper's cells (AMPD.md section 4) and the
systems compared. Every number here not in the paper is [our choice], said so."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cell:
    """One model on one workload at the paper's GPU count (H20 GPUs, or the GPU of
    ``perf_model``, a perf model file that times the cell); every run of it is a
    steady-state run (AMPD.md section 6)."""

    model: str
    workload: str
    num_gpus: int
    perf_model: str | None = None

    @property
    def label(self) -> str:
        return f"{self.model} / {self.workload} / {self.num_gpus} GPUs"


GPU = "H20"  # every cell's GPU (AMPD.md section 4); the figures name it
MODELS = ("Llama-3.1-70B", "Qwen3-32B", "Mixtral-8x7B")
WORKLOADS = {"toolbench": 8, "hotpotqa": 8, "dureader": 16, "gaia": 32}  # GPUs: AMPD.md section 4

# Rates as multiples of the cell's reference capacity (run.prepare: the capacity of plain PD
# disaggregation on an even split) [our choice]: from half of it, where every reasonable system
# meets its SLO, to past it, where only better systems still do.
RATE_FRACTIONS = (0.5, 0.75, 1.0, 1.25, 1.5)
QUICK_RATE_FRACTIONS = (0.5, 1.0, 1.5)
SEARCH_FRACTION = 1.0  # the rate of the deployment search, the latency breakdown and the sensitivity

# Disaggregated systems: the AMPD family on the planner's deployment (the search when the planner
# finds no feasible plan), the baselines on their best deployment (search.py).
PLANNED = " [planner]"  # label suffix of an adaptive system run on the planner's deployment
# The planner's options per system for its [planner] row [our choice]: the new policy, `ampd-slo`, is
# planned as its planner is built to be used, the ILP's top 5 drawn at the planner's knee and ranked
# by simulated capacity (docs/PLANNER.md, "Capacity-ranked refinement"; the issue's "optional
# simulation-refined top-k"); the paper's `ampd` and `ampd-predictive` keep the ILP's first plan.
PLANNER_OPTIONS = {"ampd-slo": {"refine_top_k": 5, "refine_by": "capacity"}}
DISAGGREGATED = ("ampd", "ampd-predictive", "ampd-slo", "pd-disagg", "dynamo-length", "dynamo-busy",
                 "dynamo-conditional")
COLOCATED = ("vllm", "vllm-chunked", "continuum")
# --quick [our choice]: the paper's AMPD, ours, plain PD disaggregation, the strongest Dynamo rule
# and the strongest colocated baseline of the full grid.
QUICK_DISAGGREGATED = ("ampd", "ampd-predictive", "pd-disagg", "dynamo-busy")
QUICK_COLOCATED = ("vllm-chunked",)
# Ablations of AMPD (AMPD.md section 3): on AMPD's deployment, remove reordering, then routing too.
ABLATION = ("ampd", "ampd-no-reorder", "pd-disagg")
# Sensitivity (AMPD.md sections 3.1, 3.2), on AMPD's deployment at the search rate; --quick
# keeps the paper's value and one or two on each side.
WINDOWS = (2, 3, 4, 5)
ALPHAS = (0.5, 0.7, 0.9, 1.0)
BETAS = (0.5, 0.7, 0.85, 1.0)
QUICK_KNOBS = {"reorder_window": (2, 3, 5), "alpha": (0.7, 0.9), "beta": (0.7, 0.85)}
# [our choice] The deployment search ranks candidates on runs a quarter of the usual window (at
# least 500 sessions): only the ranking depends on them, never a reported figure, and they are the
# largest stage of the grid.
SCREEN_WINDOW_SHARE = 0.25


def cells(quick: bool, perf_model: tuple[str, str] | None = None) -> list[Cell]:
    """The grid: 3 models x 4 workloads, or one model (Llama-3.1-70B) with --quick;
    with ``perf_model`` (its file and the name of the model in it), that model
    alone."""
    if perf_model is not None:
        path, name = perf_model
        return [Cell(name, w, gpus, path) for w, gpus in WORKLOADS.items()]
    models = MODELS[:1] if quick else MODELS
    return [Cell(m, w, gpus) for m in models for w, gpus in WORKLOADS.items()]


def systems(quick: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(disaggregated, colocated) systems of the grid."""
    return (QUICK_DISAGGREGATED, QUICK_COLOCATED) if quick else (DISAGGREGATED, COLOCATED)


def knobs(quick: bool) -> list[tuple[str, float]]:
    """(policy field, value) pairs of the sensitivity study."""
    if quick:
        return [(name, value) for name, values in QUICK_KNOBS.items() for value in values]
    return ([("reorder_window", w) for w in WINDOWS] + [("alpha", a) for a in ALPHAS]
            + [("beta", b) for b in BETAS])
