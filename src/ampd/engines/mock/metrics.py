"""A mock engine's ``GET /metrics``: the vLLM metric names a profiler reads, in the
mock's model seconds.

The mock emulates vLLM's metric surface (vLLM 0.32, ``vllm/v1/metrics/loggers.py``
and the NIXL connector's ``nixl/stats.py``) so that ``ampd profile`` measures a mock
engine exactly as it measures a real one. Times are the engine's clock (model
seconds, see ``ScaledClock``), as vLLM's are its engine-core clock; a mock run at
``time_scale`` 0.05 still reports the times of its performance model.

Differences from vLLM, [our choice] because the mock has no scheduler stage of its own:
``request_prefill_time_seconds`` runs from the request's arrival to its first token
(vLLM: from its first scheduling), so it includes any wait for the worker; the
profiler measures prefills one at a time on an idle engine, where the two agree.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

# [our choice] Request-level times: coarse buckets (the profiler reads _sum and _count).
_TIME_BUCKETS_S = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0)
# vLLM 0.32's inter-token buckets (vllm/v1/metrics/buckets.py): the profiler counts the
# steps above one of them to see how a prefill is mixed into decode steps.
_INTER_TOKEN_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                          20.0, 40.0, 80.0)
_BYTES_BUCKETS = (1e4, 1e6, 1e8, 1e10)


class MockEngineMetrics:
    """The counters of one mock engine.

    Args:
        capacity_tokens: the engine's KV capacity, reported as vLLM's
            ``cache_config_info`` with a block of 1 token (the mock's prefix hits are
            exact to the token).
        time_scale: the engine's wall seconds per model second, reported as
            ``ampd_mock_time_scale`` (``ampd.profile.overhead_probe``).
    """

    def __init__(self, capacity_tokens: int, time_scale: float = 1.0) -> None:
        self.registry = CollectorRegistry()
        self.time_to_first_token_s = Histogram("vllm:time_to_first_token_seconds", "arrival to first token, model s",
                                               registry=self.registry, buckets=_TIME_BUCKETS_S)
        self.prefill_time_s = Histogram("vllm:request_prefill_time_seconds", "arrival to first token, model s",
                                        registry=self.registry, buckets=_TIME_BUCKETS_S)
        self.decode_time_s = Histogram("vllm:request_decode_time_seconds", "first to last token, model s",
                                       registry=self.registry, buckets=_TIME_BUCKETS_S)
        self.inter_token_latency_s = Histogram("vllm:inter_token_latency_seconds", "between two tokens, model s",
                                               registry=self.registry, buckets=_INTER_TOKEN_BUCKETS_S)
        self.kv_xfer_time_s = Histogram("vllm:nixl_xfer_time_seconds", "one KV transfer, model s",
                                        registry=self.registry, buckets=_TIME_BUCKETS_S)
        self.kv_bytes = Histogram("vllm:nixl_bytes_transferred", "bytes of one KV transfer",
                                  registry=self.registry, buckets=_BYTES_BUCKETS)
        info = Gauge("vllm:cache_config_info", "KV cache configuration", ["block_size", "num_gpu_blocks"],
                     registry=self.registry)
        info.labels(block_size="1", num_gpu_blocks=str(capacity_tokens)).set(1)
        # Not vLLM's: the profiler turns its client clock into the mock's model seconds with it.
        Gauge("ampd_mock_time_scale", "wall seconds per model second", registry=self.registry).set(time_scale)

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)
