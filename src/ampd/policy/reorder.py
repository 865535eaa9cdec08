"""Prefill queue ordering: TTFT-aware reordering (AMPD.md section 3.2,
Algorithm 2) and first-come-first-served."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Protocol

from ampd.core.view import QueuedTask
from ampd.policy.decisions import ReorderDecision


class QueuePolicy(Protocol):
    """Chooses the order of a prefill queue's head. Called by the worker that owns
    the queue each time it dequeues a task."""

    def pick(self, queue: Sequence[QueuedTask], now_s: float, start_delay_s: float = 0.0) -> ReorderDecision: ...


class Fcfs:
    """First come, first served: the queue's order is kept."""

    def pick(self, queue: Sequence[QueuedTask], now_s: float, start_delay_s: float = 0.0) -> ReorderDecision:
        return ReorderDecision(tuple(range(min(1, len(queue)))), 0)


class ReturningFirst:
    """vLLM-Continuum's priority: rounds of sessions returning from a tool call
    (round index > 0) go before new sessions; first come, first served within
    each class."""

    def pick(self, queue: Sequence[QueuedTask], now_s: float, start_delay_s: float = 0.0) -> ReorderDecision:
        first = next((i for i, q in enumerate(queue) if q.task.round_index > 0), 0)
        return ReorderDecision((first,) + tuple(range(first)), 0)


class TtftAwareReorder:
    """Algorithm 2: of every permutation of the first ``window`` tasks, keep the one
    that lets the most tasks meet the TTFT threshold.

    Task k of an order completes at ``start_delay_s + sum of the costs up to k``;
    it is on time when ``(now - ready_s) + completion <= ttft_threshold_s``. The
    TTFT clock of a task starts at its round's ``ready_s`` (the paper's
    ``T_enq``; equal to the enqueue time when routing is immediate). A
    permutation that would move later a task already postponed ``window`` times
    is skipped. Permutations are visited from the identity on and only a strictly
    better one replaces the best, so ties keep the current order.

    Args:
        ttft_threshold_s: the TTFT SLO threshold.
        window: w, the number of head tasks considered (paper default 3).
    """

    def __init__(self, ttft_threshold_s: float, window: int = 3) -> None:
        if window < 1:
            raise ValueError(f"reorder window must be >= 1, got {window}")
        self.ttft_threshold_s = ttft_threshold_s
        self.window = window

    def pick(self, queue: Sequence[QueuedTask], now_s: float, start_delay_s: float = 0.0) -> ReorderDecision:
        size = min(self.window, len(queue))
        best_order, best_on_time = tuple(range(size)), -1
        for order in itertools.permutations(range(size)):
            if self._postpones_exhausted(order, queue):
                continue
            on_time = self._on_time(order, queue, now_s, start_delay_s)
            if on_time > best_on_time:
                best_order, best_on_time = order, on_time
        return ReorderDecision(best_order, max(best_on_time, 0))

    def _postpones_exhausted(self, order: tuple[int, ...], queue: Sequence[QueuedTask]) -> bool:
        return any(pos > idx and queue[idx].postponements >= self.window for pos, idx in enumerate(order))

    def _on_time(self, order: tuple[int, ...], queue: Sequence[QueuedTask], now_s: float, start_delay_s: float) -> int:
        done_s, count = start_delay_s, 0
        for idx in order:
            done_s += queue[idx].cost_s
            if (now_s - queue[idx].task.ready_s) + done_s <= self.ttft_threshold_s:
                count += 1
        return count


def apply_order(queue: Sequence[QueuedTask], decision: ReorderDecision) -> list[QueuedTask]:
    """The queue after ``decision``: the head permuted, each task that moved later
    with its postponement counter raised by one, the tail unchanged."""
    head = []
    for pos, idx in enumerate(decision.order):
        q = queue[idx]
        if pos > idx:
            q = dataclasses.replace(q, postponements=q.postponements + 1)
        head.append(q)
    return head + list(queue[len(decision.order):])
