"""A performance model with round numbers, so simulator outcomes can be worked
out by hand in the tests."""

from __future__ import annotations

from ampd.core.deployment import WorkerSpec
from ampd.perf.interface import RemoteStages, RoundPaths, TaskByTask, paper_remote_stages


class StubPerf(TaskByTask):
    """prefill: 1 ms per new token (history is free); decode step: 20 ms whatever
    the batch; KV transfer: 10 us per token between two workers, 0 within one;
    KV capacity: ``capacity_tokens`` at every TP."""

    kv_bytes_per_token = 1
    tps = (1, 2, 4, 8)
    request_overhead_s = 0.0
    decode_step_factor_beside_prefill = 1.0

    def __init__(self, capacity_tokens: int = 1_000_000) -> None:
        self.capacity_tokens = capacity_tokens

    def prefill_s(self, hist_tokens: int, new_tokens: int, tp: int) -> float:
        return 0.001 * new_tokens

    def decode_step_s(self, batch_size: int, context_tokens: int, tp: int) -> float:
        return 0.02

    def kv_transfer_s(self, tokens: int, src: WorkerSpec, dst: WorkerSpec) -> float:
        return 0.0 if src.worker_id == dst.worker_id else 1e-5 * tokens

    def kv_capacity_tokens(self, tp: int) -> int:
        return self.capacity_tokens

    def remote_stages_s(self, hist_tokens: int, new_tokens: int, prefill: WorkerSpec,
                        decode: WorkerSpec) -> RemoteStages:
        return paper_remote_stages(self, hist_tokens, new_tokens, prefill, decode)

    def measured_remote_path(self, tp: int) -> bool:
        return False

    def remote_export_s(self, hist_tokens: int, prefill: WorkerSpec, decode: WorkerSpec) -> float:
        return 0.0

    def round_paths_s(self, prefill_tp: int | None, decode_tp: int) -> RoundPaths:
        # The paper's stages hold no request's path: a remote round's two requests, a local one's.
        o = self.request_overhead_s
        return RoundPaths(o, 0.0 if prefill_tp is None else o)


class AlphaBetaStub(StubPerf):
    """Round-number alpha-beta costs, so a chunked step's parts can be told apart:
    prefill 10 ms + 1 ms per new token + 0.1 ms per history token; decode step
    20 ms + 2 ms per sequence (context free); KV as ``StubPerf``."""

    def prefill_s(self, hist_tokens: int, new_tokens: int, tp: int) -> float:
        return 0.01 + 0.001 * new_tokens + 0.0001 * hist_tokens

    def decode_step_s(self, batch_size: int, context_tokens: int, tp: int) -> float:
        return 0.02 + 0.002 * batch_size
