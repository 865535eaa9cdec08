"""Seeded synthetic sessions for the paper's workloads (numbers in ``specs``)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np

from ampd.core.errors import InputError
from ampd.core.names import unknown_name
from ampd.core.session import Round, Session
from ampd.workload.arrivals import poisson_arrivals
from ampd.workload.specs import WORKLOADS, LogNormal, RoundCount, WorkloadSpec
from ampd.workload.stream import with_arrivals


def synthetic_sessions(workload: str, rng: np.random.Generator) -> Iterator[Session]:
    """An endless stream of ``workload``'s sessions ``<workload>-<i>`` (arrival
    times 0: see ``ampd.workload.stream``).

    Args:
        workload: a key of ``specs.WORKLOADS`` (toolbench, gaia, hotpotqa, dureader).
        rng: the only source of randomness; the same seed gives the same sessions.

    Token counts are lognormal draws rounded to ints >= 1; the last round's
    ``tool_s`` is 0.

    Raises:
        InputError: unknown workload (the message lists the known ones).
    """
    if workload not in WORKLOADS:
        raise InputError(unknown_name("workload", workload, WORKLOADS))
    spec = WORKLOADS[workload]
    for i in itertools.count():
        yield Session(f"{workload}-{i}", 0.0, _sample_rounds(spec, rng))


def generate(workload: str, num_sessions: int, rate_per_s: float,
             rng: np.random.Generator) -> list[Session]:
    """``num_sessions`` sessions of ``workload`` arriving as a Poisson process
    of ``rate_per_s``: the first sessions of ``synthetic_sessions`` and
    ``poisson_arrivals``, each from its own generator spawned from ``rng``.

    Raises:
        InputError: unknown workload, a negative ``num_sessions``, or a
            ``rate_per_s`` not finite and > 0.
    """
    content_rng, arrival_rng = rng.spawn(2)
    return with_arrivals(synthetic_sessions(workload, content_rng),
                         poisson_arrivals(num_sessions, rate_per_s, arrival_rng))


def _sample_rounds(spec: WorkloadSpec, rng: np.random.Generator) -> tuple[Round, ...]:
    num_rounds = _sample_round_count(spec.rounds, rng)
    inputs = np.concatenate([_sample_tokens(spec.first_input_tokens, 1, rng),
                             _sample_tokens(spec.later_input_tokens, num_rounds - 1, rng)])
    outputs = _sample_tokens(spec.output_tokens, num_rounds, rng)
    tools_s = np.append(_sample(spec.tool_s, num_rounds - 1, rng), 0.0)
    return tuple(Round(int(i), int(o), float(t)) for i, o, t in zip(inputs, outputs, tools_s))


def _sample_round_count(rounds: RoundCount, rng: np.random.Generator) -> int:
    if rounds.shape is None:
        return int(rounds.mean)
    extra_mean = rounds.mean - 1.0
    success_p = rounds.shape / (rounds.shape + extra_mean)
    return 1 + int(rng.negative_binomial(rounds.shape, success_p))


def _sample_tokens(dist: LogNormal, size: int, rng: np.random.Generator) -> np.ndarray:
    return np.maximum(1, np.rint(_sample(dist, size, rng))).astype(int)


def _sample(dist: LogNormal, size: int, rng: np.random.Generator) -> np.ndarray:
    log_mean = math.log(dist.mean) - dist.sigma ** 2 / 2.0
    return rng.lognormal(log_mean, dist.sigma, size=size)
