"""The performance model every runtime and policy times work with (AMPD.md section 2,
DESIGN.md section 4)."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from ampd.core.deployment import WorkerSpec
from ampd.perf.measured import RequestPaths


class RemoteStages(NamedTuple):
    """A remote prefill's three stages (AMPD.md section 3, step 3), seconds.

    Attributes:
        read_s: the lazy history read, before the compute: the part of the task
            that may overlap the prefill worker's previous task.
        compute_s: the time the task holds the prefill worker.
        send_s: from the compute's end to the decode engine's first token, less what
            ``PerfModel.round_paths_s`` adds after it.

    The three add up to the task's time (callers ``sum`` them): what else is known of a
    stage lives outside the tuple (``PerfModel.remote_export_s``).
    """

    read_s: float
    compute_s: float
    send_s: float


class RoundPaths(NamedTuple):
    """A round's serving time outside its engines' own work and outside its stages
    (``RemoteStages``), by where it falls, seconds: what the simulator waits, the
    routers add to their estimates and the SLO rule adds once to its threshold.

    Attributes:
        before_s: from the round's input being ready to its task in the chosen
            engine's queue.
        after_s: from a remote round's send stage to its first token (0 for a local
            round).
    """

    before_s: float
    after_s: float


class PerfModel(Protocol):
    """Cost functions of one model on one GPU type, at any TP degree.

    All times are seconds. Implementations must be cheap to call (pure Python
    arithmetic, no numpy per call): the simulator and the router call them on
    every decision. The planner times every round of a workload at once through the
    ``*_array_s`` forms (``TaskByTask`` gives them to a model that has only the scalar
    ones).
    """

    @property
    def tps(self) -> tuple[int, ...]:
        """TP degrees the model has cost functions for, ascending (a profile: the
        degrees it measured); the others must not be asked for."""

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes of one token over all layers (K and V), whole model."""

    @property
    def request_overhead_s(self) -> float:
        """The serving path of one request to an engine: what it takes beyond the
        engine's own time to first token (HTTP legs, the API server's parsing,
        tokenising and streaming). 0 where not measured. Read through
        ``round_paths_s``, which says where a round makes such requests."""

    def prefill_s(self, hist_tokens: int, new_tokens: int, tp: int) -> float:
        """``T_pre(l_hist, l_incr; tp)``: prefill ``new_tokens`` on top of ``hist_tokens``
        of cached history, on one replica of ``tp`` GPUs."""

    def decode_step_s(self, batch_size: int, context_tokens: int, tp: int) -> float:
        """``T_dec(b; tp)``: one decode iteration of ``batch_size`` sequences whose
        KV totals ``context_tokens`` tokens."""

    def kv_transfer_s(self, tokens: int, src: WorkerSpec, dst: WorkerSpec) -> float:
        """``T_kv(l; src, dst)``: move the KV of ``tokens`` tokens from ``src`` to ``dst``
        (NVLink on one server, the network between servers); 0 when src is dst."""

    def remote_stages_s(self, hist_tokens: int, new_tokens: int, prefill: WorkerSpec,
                        decode: WorkerSpec) -> RemoteStages:
        """A remote prefill of ``new_tokens`` on ``hist_tokens`` of history, on ``prefill``
        for a session bound to ``decode``: the paper's stages (``paper_remote_stages``)
        unless the engines' own requests were measured (``ampd.perf.measured.RemotePath``)
        at both workers' TP."""

    def prefill_array_s(self, hist_tokens: np.ndarray, new_tokens: np.ndarray, tp: int) -> np.ndarray:
        """``prefill_s`` of every task, shapes (m,) of integer token counts in, (m,)
        seconds out; each element equal to the scalar call's, bit for bit."""

    def remote_stages_array_s(self, hist_tokens: np.ndarray, new_tokens: np.ndarray, prefill: WorkerSpec,
                              decode: WorkerSpec) -> RemoteStages:
        """``remote_stages_s`` of every task: shapes (m,) of integer token counts in, a
        ``RemoteStages`` of (m,) arrays out, each element equal to the scalar call's, bit
        for bit."""

    def round_paths_s(self, prefill_tp: int | None, decode_tp: int) -> RoundPaths:
        """A round's serving time beyond its engines' work and its stages: a local round
        (``prefill_tp`` None) on a decode worker of ``decode_tp``, or a remote one from a
        prefill worker of ``prefill_tp``. Every place that times a round reads it, so
        the simulator, the routers, the planner and the SLO rule count one path."""

    def measured_remote_path(self, tp: int) -> bool:
        """Whether a profile measured a remote round's engine requests at TP ``tp`` (then
        ``remote_stages_s`` of two workers of that TP are those requests)."""

    def remote_request_paths_s(self, tp: int) -> RequestPaths:
        """The serving path of each of a remote round's engine requests (export, prefill,
        join) at TP ``tp``, seconds: as a profile timed them, else each
        ``request_overhead_s``."""

    def remote_export_s(self, hist_tokens: int, prefill: WorkerSpec, decode: WorkerSpec) -> float:
        """The leading part of ``remote_stages_s(...).compute_s`` spent on the decode engine
        (a measured remote round's history export, with its serving path), while the
        prefill engine is idle; 0 on the paper's stages, whose compute is all the prefill
        engine's. What is left of the compute stage is the prefill engine's own work (what
        slows a decode engine on its host, ``decode_step_factor_beside_prefill``)."""

    @property
    def decode_step_factor_beside_prefill(self) -> float:
        """How many times longer a decode engine's step takes while a prefill engine on
        the same host computes (``ampd.perf.measured.SharedHost``; >= 1): 1 where not
        measured, as for engines on GPUs of their own."""

    def kv_capacity_tokens(self, tp: int) -> int:
        """KV tokens one replica of ``tp`` GPUs can hold: GPU memory minus weights
        (and a reserve for activations), divided by ``kv_bytes_per_token``."""


class TaskByTask:
    """The ``*_array_s`` forms of ``PerfModel`` by one scalar call per task, for a model
    that has only the scalar ones (the tests' hand-made models): correct, and as slow
    as a Python loop over the tasks."""

    def prefill_array_s(self, hist_tokens: np.ndarray, new_tokens: np.ndarray, tp: int) -> np.ndarray:
        """``PerfModel.prefill_array_s``."""
        return np.array([self.prefill_s(h, x, tp) for h, x in zip(hist_tokens.tolist(), new_tokens.tolist())],
                        dtype=np.float64)

    def remote_stages_array_s(self, hist_tokens: np.ndarray, new_tokens: np.ndarray, prefill: WorkerSpec,
                              decode: WorkerSpec) -> RemoteStages:
        """``PerfModel.remote_stages_array_s``."""
        stages = [self.remote_stages_s(h, x, prefill, decode)
                  for h, x in zip(hist_tokens.tolist(), new_tokens.tolist())]
        return RemoteStages(*np.array(stages, dtype=np.float64).reshape(len(stages), 3).T)


def paper_remote_stages(perf: PerfModel, hist_tokens: int, new_tokens: int, prefill: WorkerSpec,
                        decode: WorkerSpec) -> RemoteStages:
    """AMPD's remote prefill (AMPD.md section 3, step 3): read the history's KV from the
    decode worker (``T_kv(l_hist)``), prefill the new tokens on it (``T_pre``), send their
    KV back (``T_kv(l_incr)``)."""
    return RemoteStages(perf.kv_transfer_s(hist_tokens, decode, prefill),
                        perf.prefill_s(hist_tokens, new_tokens, prefill.tp),
                        perf.kv_transfer_s(new_tokens, prefill, decode))
