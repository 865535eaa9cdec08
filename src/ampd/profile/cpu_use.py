"""Where a real run's CPU goes: the CPU time each part of a local cluster (Redis, each
engine, each coordinator) and the client used over the run, from the kernel's own
per-process counters (psutil).

On a host where the engines, the coordinator and the client share a few cores, a
served round waits for CPU as well as for its engines; ``ampd validate`` reports
each part's CPU seconds per wall second of the run beside the engines' counters, so
that a gap between the simulator and the cluster can be read against who was using
the cores (docs/PROFILING.md, "Sim vs real").
"""

from __future__ import annotations

from collections.abc import Mapping

import psutil


def cpu_seconds(parts: Mapping[str, int], tree: bool = True) -> dict[str, float]:
    """CPU seconds (user + system, the kernel's counters) each part has used since it
    started: the process ``pid`` and, with ``tree``, every live process below it and
    the children each of them has reaped (an engine's API server, its engine core and
    their helpers; a child that exits and is reaped stays counted in its parent's
    figure). A part whose process is gone, or that this user may not read
    (``psutil.AccessDenied``), reads 0; a process in the tree that goes while it is
    read is left out. A part's figure counts from its process's start: a part
    restarted between two readings counts from the new start.

    Args:
        parts: part name -> process id.
        tree: count the processes below each part's process too.
    """
    used = {}
    for name, pid in parts.items():
        try:
            root = psutil.Process(pid)
            processes = [root, *(root.children(recursive=True) if tree else ())]
        except psutil.Error:
            used[name] = 0.0
            continue
        total = 0.0
        for process in processes:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue
            total += times.user + times.system
            if tree:
                total += times.children_user + times.children_system
        used[name] = total
    return used


def cpu_share(before: Mapping[str, float], after: Mapping[str, float], wall_s: float) -> dict[str, float]:
    """Each part's CPU seconds per wall second between two ``cpu_seconds`` readings
    (1.0: one core's worth; a part missing from ``before`` counts from 0, one missing
    from ``after`` is left out; a figure that went down, a part restarted, reads 0).

    Raises:
        ValueError: ``wall_s`` is not positive.
    """
    if wall_s <= 0:
        raise ValueError(f"cpu_share: wall_s must be positive, got {wall_s}")
    return {name: max(0.0, seconds - before.get(name, 0.0)) / wall_s for name, seconds in after.items()}
