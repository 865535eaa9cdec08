"""Where a served round's TTFT goes, phase by phase (``ampd_round_phase_seconds``;
docs/SERVING.md "Metrics", docs/PROFILING.md "Sim vs real").

The engines' own counters time what happens inside them; the client sees the
whole TTFT. The phases below split that TTFT at the points the coordinator
passes, so a gap between the simulator and a real cluster can be put where it
lies. For a remote round they add up to its TTFT exactly:

- ``route``: from the round's arrival to its routing decision (session binding,
  the shared state read, the decision);
- ``queue``: in the coordinator-held prefill queue, until a dispatcher takes it;
- ``export``: the history export the lazy history read needs on vLLM with NIXL
  (``history_export``: a one-token request to the decode engine), 0 elsewhere;
- ``prefill``: the prefill engine's request, as the dispatcher sees it (its
  API path, queue, KV read and compute);
- ``handoff``: the store's hops around those (push, lease, take, the result
  published back to this replica): what the round's other phases leave;
- ``first_token``: the decode engine's streamed request until its first token
  (its API path, queue, the new KV's read, the first step).

A local round (or a remote one that fell back to a local recompute, or one
whose session moved to another decode engine mid-round) has ``route`` and
``first_token`` only, and is labelled so (``local``, ``fallback``, ``rebind``).
All in model seconds (wall seconds at time scale 1), as the TTFT histogram.

The dispatcher times ``queue`` from the task's enqueue, stamped by the replica
that queued it: across hosts whose clocks differ, the skew moves between
``queue`` (never below 0) and ``handoff``. A remote round dispatched by a
replica that reports no phases counts its queue and prefill in ``handoff``.
"""

from __future__ import annotations

from ampd.serve.rounds.round import RoundTrace

DISPATCH_PHASES = ("queue", "export", "prefill")
"""The phases the dispatcher times and sends back with a prefill's outcome."""

PHASES = {"remote": ("route", *DISPATCH_PHASES, "handoff", "first_token"), "local": ("route", "first_token"),
          "fallback": ("route", "first_token"), "rebind": ("route", "first_token")}
"""Each route label's phases, in the order a round passes them."""


def phases_s(trace: RoundTrace, first_token_s: float) -> tuple[str, dict[str, float]]:
    """(route label, {phase: seconds}) of a round whose first token came at
    ``first_token_s``; a remote round's phases sum to ``first_token_s -
    trace.ready_s``. ``trace.routed_s`` unset (a degraded round, served without
    the shared state) counts its whole TTFT as ``first_token``."""
    routed_s = trace.ready_s if trace.routed_s is None else trace.routed_s
    phases = {"route": routed_s - trace.ready_s}
    if trace.rebinds:
        label = "rebind"
    elif trace.fallback is not None:
        label = "fallback"
    elif trace.local or trace.kv_ready_s is None:
        label = "local"
    else:
        label = "remote"
        dispatched = {name: trace.remote_phases_s.get(name, 0.0) for name in DISPATCH_PHASES}
        phases.update(dispatched)
        phases["handoff"] = trace.kv_ready_s - routed_s - sum(dispatched.values())
        routed_s = trace.kv_ready_s
    phases["first_token"] = first_token_s - routed_s
    return label, phases
