"""What ``ampd reproduce`` runs: the paper's cells (AMPD.md section 4) and the
systems compared. Every number here not in the paper is [our choice], said so."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cell:
    """One model on one workload at the paper's GPU count (H20 GPUs).

    Attributes:
        num_sessions: sessions per simulation [our choice]: enough that arrivals
            span several session lifetimes at the knee (GAIA sessions live
            minutes, so more of them).
    """

    model: str
    workload: str
    num_gpus: int
    num_sessions: int

    @property
    def label(self) -> str:
        return f"{self.model} / {self.workload} / {self.num_gpus} GPUs"


MODELS = ("Llama-3.1-70B", "Qwen3-32B", "Mixtral-8x7B")
# Workload -> (GPUs, sessions in the full grid, sessions in --quick); GPUs from AMPD.md section 4.
WORKLOADS = {"toolbench": (8, 300, 100), "hotpotqa": (8, 300, 100), "dureader": (16, 300, 100),
             "gaia": (32, 400, 120)}

# Rates as multiples of the cell's knee (capacity.py) [our choice]: from well below it, where every
# system should meet its SLO, to well past it.
RATE_FRACTIONS = (0.4, 0.7, 1.0, 1.3, 1.6)
QUICK_RATE_FRACTIONS = (0.5, 1.0, 1.5)
SEARCH_FRACTION = 1.0  # the rate of the search, the latency breakdown and the sensitivity (in both grids)

# Disaggregated systems: the AMPD family on the planner's deployment (the search when the planner
# finds no feasible plan), the baselines on their best deployment (search.py).
PLANNED = " [planner]"  # label suffix of an adaptive system run on the planner's deployment
DISAGGREGATED = ("ampd", "ampd-predictive", "pd-disagg", "dynamo-length", "dynamo-busy", "dynamo-conditional")
COLOCATED = ("vllm", "vllm-chunked", "continuum")
# Ablations of AMPD (AMPD.md section 3): on AMPD's deployment, remove reordering, then routing too.
ABLATION = ("ampd", "ampd-no-reorder", "pd-disagg")
# Sensitivity (AMPD.md sections 3.1, 3.2), on AMPD's deployment at the search rate.
WINDOWS = (2, 3, 4, 5)
ALPHAS = (0.5, 0.7, 0.9, 1.0)
BETAS = (0.5, 0.7, 0.85, 1.0)


def cells(quick: bool) -> list[Cell]:
    """The grid: 3 models x 4 workloads, or one model (Llama-3.1-70B) with --quick."""
    models = MODELS[:1] if quick else MODELS
    return [Cell(m, w, gpus, quick_n if quick else full_n)
            for m in models for w, (gpus, full_n, quick_n) in WORKLOADS.items()]
