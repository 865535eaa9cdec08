"""Each system's best deployment on a cell's GPUs, found by simulation.

[our choice] Coarse to fine: first every usable pair of TP degrees with half the
GPUs prefilling (the candidate closest to half), then every prefill share for the
best pair (``deployments.PREFILL_SHARES``); colocated systems try every degree.
A candidate's score, at the search rate (the cell's reference capacity): first
whether it meets the SLO in steady state (``ampd.measure.capacity.meets_slo``:
its capacity is then at least that rate), then whether its run was stable, then
its SLO attainment, ties broken by the lower mean TTFT, then by the candidate
order. The reproduce grid screens on runs of a quarter window
(``grid.SCREEN_WINDOW_SHARE``), too short for a verdict (transient) unless
stopped for overload: there the score is an overloaded run last, then attainment.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ampd.config import RunConfig, override
from ampd.core.deployment import Deployment, Role
from ampd.measure import STABLE
from ampd.measure.capacity import meets_slo

Evaluate = Callable[[Sequence[RunConfig]], list[dict]]


def _tp_pair(d: Deployment) -> tuple[int, int]:
    return (next(g.tp for g in d.groups if g.role is Role.PREFILL), next(g.tp for g in d.groups if g.role is Role.DECODE))


def _prefill_gpus(d: Deployment) -> int:
    return sum(g.tp * g.dp for g in d.groups if g.role is Role.PREFILL)


def coarse(candidates: list[Deployment], num_gpus: int) -> list[Deployment]:
    """Per TP pair, the candidate whose prefill GPUs are closest to half."""
    best: dict[tuple[int, int], Deployment] = {}
    for d in candidates:
        pair = _tp_pair(d)
        if pair not in best or abs(_prefill_gpus(d) - num_gpus / 2) < abs(_prefill_gpus(best[pair]) - num_gpus / 2):
            best[pair] = d
    return list(best.values())


def same_pair(candidates: list[Deployment], chosen: Deployment) -> list[Deployment]:
    """The candidates with ``chosen``'s TP pair (every prefill share)."""
    return [d for d in candidates if _tp_pair(d) == _tp_pair(chosen)]


def _score(row: dict) -> tuple[bool, bool, float, float]:
    ttft = row["ttft_mean_s"]
    return (not meets_slo(row), row["verdict"] != STABLE, -row["slo_attainment"], ttft if ttft == ttft else math.inf)


def pick_best(searches: dict, evaluate: Evaluate) -> dict:
    """For each ``key: (config, candidates)``, the candidate with the best score for
    ``config`` (its system and rate). All candidates of all keys are simulated in
    one ``evaluate`` call, so they run in parallel.

    Raises:
        ValueError: a key without candidates.
    """
    configs, owners = [], []
    for key, (config, candidates) in searches.items():
        if not candidates:
            raise ValueError(f"no candidate deployment for {key}")
        for i, d in enumerate(candidates):
            configs.append(override(config, cluster={"deployment": str(d)}))
            owners.append((key, i))
    scores: dict = {}
    for (key, i), row in zip(owners, evaluate(configs)):
        scores.setdefault(key, []).append((_score(row), i))
    return {key: searches[key][1][min(scores[key])[1]] for key in searches}
