"""A multi-server FCFS queue by Lindley's recursion, closed over each session's rounds:
the prefill side of the tau estimate (AMPD.md section 2; docs/PLANNER.md, "Prefill side")."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class PrefillChains:
    """Prefill tasks linked into sessions, shape (m,) each (plain lists: the recursion
    runs in Python).

    Attributes:
        arrival_s: when the task's input exists if it opens its session; a later round's
            ready time is not read: it follows from its predecessor (``after_s``).
        read_s, compute_s, send_s: history read, prefill, new-KV return, seconds.
        remote: True for the tasks the prefill replicas run; a local one runs on its
            decode replica in ``compute_s`` without queueing here.
        after_s: from a task's first token to its session's next round being ready:
            the rest of the round's decode, then the tool call.
        next_task: index of the session's next round, -1 after the last.
    """

    arrival_s: list[float]
    read_s: list[float]
    compute_s: list[float]
    send_s: list[float]
    remote: list[bool]
    after_s: list[float]
    next_task: list[int]

    @cached_property
    def opening(self) -> list[int]:
        """Indices of the tasks that open their session (no task leads to them)."""
        return sorted(set(range(len(self.arrival_s))) - set(self.next_task))


def fcfs_ttft_s(chains: PrefillChains, num_servers: int) -> tuple[list[float], bool]:
    """TTFT of each task on ``num_servers`` identical prefill replicas fed by one FCFS
    queue, and whether any remote task found every replica busy.

    Lindley's recursion for c servers, in ready order: a remote task goes to the replica
    whose compute frees first, at ``f``; it computes from ``max(ready + read, f)`` and its
    first token arrives ``send`` later. The history read overlaps the previous task's
    compute, as the simulator's lazy read does (exact whenever a read is shorter than the
    compute before it). The loop is closed: a session's next round is ready ``after_s``
    after this one's first token, so a slow prefill delays the session's later load, as
    in the simulator. One shared queue is what plain PD disaggregation's least-loaded
    routing amounts to: the replica with the least queued work is the one that frees first.

    Args:
        chains: the tasks; round 0 of every session carries its arrival.
        num_servers: replicas, >= 1.

    Returns:
        (TTFT per task in seconds, True when some remote task waited for a replica).
    """
    arrival_s, read_s, compute_s, send_s = chains.arrival_s, chains.read_s, chains.compute_s, chains.send_s
    remote, after_s, next_task = chains.remote, chains.after_s, chains.next_task
    pop, push, replace = heapq.heappop, heapq.heappush, heapq.heapreplace
    pending = [(arrival_s[t], t) for t in chains.opening]
    heapq.heapify(pending)
    free_s = [float("-inf")] * num_servers
    ttft_s = [0.0] * len(arrival_s)
    waited = False
    while pending:
        ready, t = pop(pending)
        if remote[t]:
            start = ready + read_s[t]
            if free_s[0] > start:
                start, waited = free_s[0], True
            end = start + compute_s[t]
            replace(free_s, end)
            first = end + send_s[t]
        else:
            first = ready + compute_s[t]
        ttft_s[t] = first - ready
        if next_task[t] >= 0:
            push(pending, (first + after_s[t], next_task[t]))
    return ttft_s, waited
