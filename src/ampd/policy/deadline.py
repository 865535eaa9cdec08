"""Deadline-aware prefill queue ordering (ours, not the paper's): Algorithm 2's
objective, the number of queued tasks that meet their TTFT deadline, maximised
over the whole queue instead of its first w tasks, with a starvation bound."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from ampd.core.view import QueuedTask
from ampd.policy.decisions import ReorderDecision


class DeadlineReorder:
    """Earliest deadline first among the tasks that can still meet theirs; the
    others go to the back.

    A task's deadline is ``ready_s + ttft_threshold_s`` (its TTFT clock starts
    when its round's input is ready, as in Algorithm 2). At each dequeue:

    1. **Starvation bound.** The first task in queue order that has been
       postponed ``max_postponements`` times runs next. Choosing the first one
       postpones none of the others in that state, so no task is ever postponed
       more than ``max_postponements`` times.
    2. **Most tasks on time** (Moore and Hodgson, "A n-job, one machine
       sequencing algorithm for minimizing the number of late jobs", Management
       Science 1968): tasks are taken in deadline order (ties: queue order),
       each finishing ``start_delay_s`` plus the costs of those kept before it
       after ``now_s``; whenever one would finish after its deadline, the
       longest task kept so far (ties: the later in deadline order) is dropped.
       The tasks kept are the largest set that can all meet their deadlines
       run one after another, and deadline order meets them all; the one with
       the earliest deadline runs next. Algorithm 2 seeks the same count by
       trying every order of the first w tasks; this finds it for the whole
       queue in O(n log n).
    3. **Past-deadline rule.** When no task can meet its deadline, the queue's
       order is kept: the oldest runs first, which bounds how late the late
       rounds get (under the mean scope their session may still attain,
       AMPD.md section 1).

    The task chosen goes to the head; the tasks it passes are moved one place
    later and their postponement counters are raised (``apply_order``).

    Args:
        ttft_threshold_s: the TTFT SLO threshold, s.
        max_postponements: K, the starvation bound: a task waits for at most
            K tasks queued after it. Systems take ``Knobs.max_postponements``
            (16, [our choice]: at Algorithm 2's own bound, w = 3, it forces late
            tasks forward so often that it gives up half the gain over FCFS;
            16 keeps almost all of the unbounded policy's, docs/RESULTS.md).

    Raises:
        ValueError: ``max_postponements`` < 1 (the policy could never reorder).
    """

    def __init__(self, ttft_threshold_s: float, max_postponements: int) -> None:
        if max_postponements < 1:
            raise ValueError(f"max_postponements must be >= 1, got {max_postponements}")
        self.ttft_threshold_s = ttft_threshold_s
        self.max_postponements = max_postponements

    def pick(self, queue: Sequence[QueuedTask], now_s: float, start_delay_s: float = 0.0) -> ReorderDecision:
        """The next task to run, as an order of the head of ``queue``.

        Args:
            queue: the waiting tasks, in queue order.
            now_s: the current time, s.
            start_delay_s: time until the worker can start the next task (the
                compute in flight), s.

        Returns:
            ``order`` = (chosen index, every index before it, in order), empty
            for an empty queue; ``on_time`` = how many queued tasks the chosen
            plan predicts on time (0 when the starvation bound or the
            past-deadline rule decided).
        """
        if not queue:
            return ReorderDecision((), 0)
        starved = next((i for i, q in enumerate(queue) if q.postponements >= self.max_postponements), None)
        if starved is not None:
            return ReorderDecision(_first(starved), 0)
        kept = self._most_on_time(queue, now_s + start_delay_s)
        if not kept:
            return ReorderDecision(_first(0), 0)
        return ReorderDecision(_first(kept[0]), len(kept))

    def _most_on_time(self, queue: Sequence[QueuedTask], start_s: float) -> list[int]:
        """Indices of the largest set of tasks that meet their deadlines run from
        ``start_s`` on, in deadline order (Moore-Hodgson)."""
        deadline_s = [q.task.ready_s + self.ttft_threshold_s for q in queue]
        by_deadline = sorted(range(len(queue)), key=lambda i: (deadline_s[i], i))
        kept: list[tuple[float, int, int]] = []  # max-heap on (cost, rank in deadline order)
        done_s = start_s
        for rank, i in enumerate(by_deadline):
            heapq.heappush(kept, (-queue[i].cost_s, -rank, i))
            done_s += queue[i].cost_s
            if done_s > deadline_s[i]:
                neg_cost_s, _, _ = heapq.heappop(kept)
                done_s += neg_cost_s
        return sorted((i for _, _, i in kept), key=lambda i: (deadline_s[i], i))


def _first(index: int) -> tuple[int, ...]:
    """The order that moves ``index`` to the head and keeps the rest."""
    return (index,) + tuple(range(index))
