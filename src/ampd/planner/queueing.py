"""A multi-server FCFS queue by Lindley's recursion, closed over each session's rounds:
the prefill side of the tau estimate (AMPD.md section 2; docs/PLANNER.md, "Prefill side")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numba
import numpy as np


@dataclass(frozen=True)
class PrefillChains:
    """Prefill tasks linked into sessions, shape (m,) each (any sequence; kept as
    numpy arrays for the compiled recursion).

    Attributes:
        arrival_s: when the task's input exists if it opens its session; a later round's
            ready time is not read: it follows from its predecessor (``after_s``).
        read_s, compute_s, send_s: history read, prefill, new-KV return, seconds.
        remote: True for the tasks the prefill replicas run; a local one runs on its
            decode replica in ``compute_s`` without queueing here.
        after_s: from a task's first token to its session's next round being ready:
            the rest of the round's decode, then the tool call.
        next_task: index of the session's next round, -1 after the last.
        local_s: shape (m,), a task's prefill when it runs on its decode replica,
            seconds (``T_pre``); None: ``compute_s`` (the two are one unless a profile
            measured a remote round's requests, which a local task does not make).
        remote_paths_s: a remote task's serving path outside its stages
            (``perf.round_paths_s``: ``(before_s, after_s)``), seconds: it reaches the
            prefill replica ``before_s`` after it is ready, and its first token comes
            ``after_s`` after its send stage.
        local_path_s: a local task's serving path (``perf.round_paths_s(None, tp)``'s
            ``before_s``), seconds: it starts that long after it is ready.
    """

    arrival_s: np.ndarray
    read_s: np.ndarray
    compute_s: np.ndarray
    send_s: np.ndarray
    remote: np.ndarray
    after_s: np.ndarray
    next_task: np.ndarray
    remote_paths_s: tuple[float, float] = (0.0, 0.0)
    local_path_s: float = 0.0
    local_s: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.local_s is None:
            object.__setattr__(self, "local_s", self.compute_s)
        for name in ("arrival_s", "read_s", "compute_s", "send_s", "after_s", "local_s"):
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=np.float64))
        object.__setattr__(self, "remote", np.asarray(self.remote, dtype=np.bool_))
        object.__setattr__(self, "next_task", np.asarray(self.next_task, dtype=np.int64))

    @cached_property
    def opening(self) -> np.ndarray:
        """Indices of the tasks that open their session (no task leads to them), ascending."""
        led = np.zeros(self.arrival_s.size, dtype=bool)
        led[self.next_task[self.next_task >= 0]] = True
        return np.flatnonzero(~led)


@dataclass(frozen=True)
class ServerGroup:
    """Prefill replicas of a further degree sharing the queue with those of
    ``fcfs_ttft_s``'s chains (a prefill side of mixed degrees; docs/PLANNER.md,
    "Mixed degrees"), each task's stages at that degree.

    Attributes:
        count: replicas, >= 1.
        read_s, compute_s, send_s: shape (m,), as ``PrefillChains``'s, at this degree.
        paths_s: a remote round's serving path at this degree, ``(before_s, after_s)``.
    """

    count: int
    read_s: np.ndarray
    compute_s: np.ndarray
    send_s: np.ndarray
    paths_s: tuple[float, float] = (0.0, 0.0)


class QueueRun(NamedTuple):
    """What ``fcfs_ttft_s`` returns.

    Attributes:
        ttft_s: TTFT per task, seconds, shape (m,).
        waited: True when some remote task found every replica busy, or (router
            model) was sent locally while they were, or (mixed degrees) found every
            replica of the first group busy: more replicas of it may change the run.
        local: per task, True when it ran on its decode replica (flagged local in
            the chains, or sent there by the router model), shape (m,).
    """

    ttft_s: np.ndarray
    waited: bool
    local: np.ndarray


def fcfs_ttft_s(chains: PrefillChains, num_servers: int, local_above_s: float = math.inf,
                beside: tuple[ServerGroup, ...] = ()) -> QueueRun:
    """TTFT of each task on ``num_servers`` identical prefill replicas (and the replicas of
    other degrees ``beside`` them) fed by one FCFS queue, whether any remote task found
    every replica busy, and which tasks ran locally.

    Lindley's recursion for c servers, in ready order: a remote task goes to the replica
    whose compute frees first, at ``f``; it computes from ``max(ready + before + read, f)``
    and its first token arrives ``send + after`` later (``before``, ``after``: the round's
    serving path, ``remote_paths_s``, 0 but in a profile). The history read overlaps the previous task's
    compute, as the simulator's lazy read does (exact whenever a read is shorter than the
    compute before it). The loop is closed: a session's next round is ready ``after_s``
    after this one's first token, so a slow prefill delays the session's later load, as
    in the simulator. One shared queue is what plain PD disaggregation's least-loaded
    routing amounts to: the replica with the least queued work is the one that frees first.

    The router model (``local_above_s`` finite; docs/PLANNER.md, "Co-design"): a task
    the chains flag remote runs locally instead when the TTFT the adaptive router
    predicts for it at the replica that frees first, ``max(f - ready, 0) + read +
    compute + send + before + after`` (``ampd.policy.routing.PredictiveRouter``'s step 1 at the moment
    the task is ready), exceeds ``local_above_s`` (alpha x the TTFT threshold). Steps 2
    and 3 of Algorithm 1 are taken to run it locally (its decode replica within beta x
    the ITL threshold, or a local estimate below a remote one already above alpha x
    the threshold).

    Mixed degrees (``beside``): servers of a group are identical, so each group's
    candidate is the replica that frees first in it, and the groups differ in their
    stages. Which group takes a task is the system's rule at the moment it is ready:
    without the router model, plain PD disaggregation's least queued work
    (``max(f - ready, 0)``, ``routing.least_loaded_prefill``); under it, the smallest
    predicted TTFT above (``PredictiveRouter``, ``SloRouter``). Ties go to the chains'
    own replicas, which come first in the deployment (lowest worker ids), then to the
    groups in order.

    Args:
        chains: the tasks; round 0 of every session carries its arrival.
        num_servers: replicas, >= 1.
        local_above_s: the predicted remote TTFT above which the router runs a task
            locally, seconds; ``math.inf`` (default): every task the chains flag
            remote runs remotely.
        beside: further replicas of other degrees in the same queue; default none.
    """
    if chains.arrival_s.size == 0:
        return QueueRun(np.zeros(0), False, np.zeros(0, dtype=bool))
    groups = (ServerGroup(num_servers, chains.read_s, chains.compute_s, chains.send_s, chains.remote_paths_s),
              *beside)
    stages = [np.vstack([np.asarray(getattr(g, name), dtype=np.float64) for g in groups])
              for name in ("read_s", "compute_s", "send_s")]
    paths = np.array([g.paths_s for g in groups], dtype=np.float64).reshape(len(groups), 2)
    ttft_s, waited, local = _lindley(chains.arrival_s, *stages, chains.remote, chains.after_s, chains.next_task,
                                     chains.opening, np.array([g.count for g in groups], dtype=np.int64),
                                     local_above_s, paths[:, 0].copy(), paths[:, 1].copy(), chains.local_path_s,
                                     chains.local_s)
    return QueueRun(ttft_s, bool(waited), local)


# Compiled: the recursion is sequential (each task's start depends on the queue before it),
# and in Python it was most of the planning time at 256 GPUs (issue 12: <= 5 s). With one
# group, the same IEEE operations in the same order as the Python loop it replaced, which it
# matched bit for bit on the 256-GPU stream (docs/PLANNER.md, "Planning time"). Stages are
# shape (groups, m), one row per degree; a task's group is chosen before its own recursion.
# The heaps are arrays (issue 37: heapq on a list of tuples spent most of each pass
# boxing them); the ready queue is ordered by (ready time, task index), as the tuples
# were, so tasks leave it in the same order; a replica heap holds only when each replica
# frees, so what its minimum reads does not depend on its layout.
@numba.njit(cache=True, nogil=True)
def _lindley(arrival_s, read_s, compute_s, send_s, remote, after_s, next_task, opening, counts,
             local_above_s, path_before_s, path_after_s, local_path_s, local_s):
    size = opening.size
    ready_keys = arrival_s[opening].copy()
    ready_tasks = opening.astype(np.int64)
    for i in range(size // 2 - 1, -1, -1):
        _sift_ready(ready_keys, ready_tasks, size, i)
    free_s = np.full((counts.size, counts.max()), -math.inf)
    ttft_s = np.zeros(arrival_s.size)
    local = ~remote
    routed, waited = local_above_s < math.inf, False
    while size > 0:
        ready, t = ready_keys[0], ready_tasks[0]
        g, queued_s = 0, free_s[0, 0] - ready if free_s[0, 0] > ready else 0.0
        if routed:
            best_s = queued_s + read_s[0, t] + compute_s[0, t] + send_s[0, t] + path_before_s[0] + path_after_s[0]
        for other in range(1, counts.size):
            other_queued_s = free_s[other, 0] - ready if free_s[other, 0] > ready else 0.0
            if routed:
                other_s = (other_queued_s + read_s[other, t] + compute_s[other, t] + send_s[other, t]
                           + path_before_s[other] + path_after_s[other])
                if other_s < best_s:
                    g, queued_s, best_s = other, other_queued_s, other_s
            elif other_queued_s < queued_s:
                g, queued_s = other, other_queued_s
        # mixed: an idle replica more in the first group could take a task the others took
        waited = waited or (counts.size > 1 and remote[t] and free_s[0, 0] > ready)
        if routed and remote[t]:
            local[t] = best_s > local_above_s
            # sent away from busy replicas: more replicas would have kept it, as a wait would
            waited = waited or (local[t] and queued_s > 0.0)
        if not local[t]:
            start = ready + path_before_s[g] + read_s[g, t]
            if free_s[g, 0] > start:
                start, waited = free_s[g, 0], True
            end = start + compute_s[g, t]
            free_s[g, 0] = end
            _sift_free(free_s[g], counts[g])
            first = end + send_s[g, t] + path_after_s[g]
        else:
            first = ready + local_path_s + local_s[t]
        ttft_s[t] = first - ready
        if next_task[t] >= 0:  # the session's next round takes this one's place in the queue
            ready_keys[0], ready_tasks[0] = first + after_s[t], next_task[t]
        else:
            size -= 1
            ready_keys[0], ready_tasks[0] = ready_keys[size], ready_tasks[size]
        _sift_ready(ready_keys, ready_tasks, size, 0)
    return ttft_s, waited, local


@numba.njit(cache=True, nogil=True)
def _sift_ready(keys, tasks, size, i):
    """Restore the ready queue's heap order below entry ``i`` (entries ordered by key, then task)."""
    key, task = keys[i], tasks[i]
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and (keys[child + 1] < keys[child]
                                 or (keys[child + 1] == keys[child] and tasks[child + 1] < tasks[child])):
            child += 1
        if keys[child] < key or (keys[child] == key and tasks[child] < task):
            keys[i], tasks[i] = keys[child], tasks[child]
            i = child
        else:
            break
    keys[i], tasks[i] = key, task


@numba.njit(cache=True, nogil=True)
def _sift_free(free_s, size):
    """Restore a replica heap's order after its root (the replica that freed first) changed."""
    value, i = free_s[0], 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and free_s[child + 1] < free_s[child]:
            child += 1
        if free_s[child] < value:
            free_s[i] = free_s[child]
            i = child
        else:
            break
    free_s[i] = value
