"""Decisions the policies return: dataclasses that are logged, so a run can be
explained afterwards (DESIGN.md section 4)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BindDecision:
    """Binding of a session to the decode worker that will own its KV cache.

    Attributes:
        session_id: the session.
        worker_id: chosen decode worker.
        kv_free_tokens: that worker's free KV tokens when chosen (the criterion).
    """

    session_id: str
    worker_id: int
    kv_free_tokens: int


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where one prefill runs (Algorithm 1).

    Attributes:
        session_id, round_index: the task.
        worker_id: the worker that runs it (the bound decode worker when local).
        local: True when it runs on the bound decode worker.
        rule: which step of Algorithm 1 decided: ``"prefill-window"`` (step 1: a
            prefill worker's windowed TTFT is under alpha x threshold),
            ``"decode-window"`` (step 2: the decode worker's windowed ITL is under
            beta x threshold), ``"prefill-predicted"`` (step 1 of the predictive
            variant), ``"estimate"`` (step 3: smallest predicted
            completion), ``"always-remote"``, ``"threshold-length"``,
            ``"threshold-busy"``, ``"threshold-remote"`` (Dynamo's rules),
            ``"colocated"``, or ``ampd-slo``'s ``"slo-remote"``, ``"slo-local"``,
            ``"slo-degraded"`` (``ampd.policy.slo_routing``).
        basis_s: the figure the rule compared, seconds: the chosen worker's
            windowed TTFT (``"prefill-window"``, 0 when its window is empty), the
            decode worker's windowed ITL (``"decode-window"``, likewise), the
            predicted completion (``"estimate"``), the predicted TTFT
            (``"prefill-predicted"``, ``"slo-*"``), the chosen worker's queue drain
            (``"always-remote"``).
        alternatives: (worker id, predicted completion s) of every option weighed in
            step 3, local first; (worker id, predicted TTFT s) for ``"slo-*"``
            (local inf when it would break the batch's ITL budget); empty for the
            other rules.
        chunk_tokens: for a local prefill, the prefill tokens per mixed step the
            decode worker must run it in; None: the engine's own budget.
    """

    session_id: str
    round_index: int
    worker_id: int
    local: bool
    rule: str
    basis_s: float = 0.0
    alternatives: tuple[tuple[int, float], ...] = ()
    chunk_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ReorderDecision:
    """Order of the head of a prefill queue (Algorithm 2).

    Attributes:
        order: permutation of the window: ``order[k]`` is the index (in the current
            queue) of the task placed at position k. Tasks past the window keep
            their place.
        on_time: predicted number of tasks meeting the TTFT threshold: of the
            window (``S_pi`` of the chosen order, Algorithm 2), or of the whole
            queue (``DeadlineReorder``; 0 when its starvation bound or its
            past-deadline rule decided).
    """

    order: tuple[int, ...]
    on_time: int
