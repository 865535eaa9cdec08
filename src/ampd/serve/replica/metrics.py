"""The coordinator's Prometheus metrics (``GET /metrics``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Latency buckets, seconds: from sub-millisecond ITLs to multi-second TTFTs.
_LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
_DECISION_BUCKETS_S = (5e-5, 1e-4, 2e-4, 3.9e-4, 1e-3, 2.5e-3, 1e-2, 0.1)


class ServeMetrics:
    """One registry per coordinator, so several can live in one process (tests)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.rounds = Counter("ampd_rounds", "Rounds served, by where their prefill ran", ["route"], registry=r)
        self.fallbacks = Counter("ampd_kv_fallbacks", "Remote prefills recomputed locally, by reason", ["reason"],
                                 registry=r)
        self.rebinds = Counter("ampd_rebinds", "Sessions moved off a dead decode engine", registry=r)
        self.store_errors = Counter("ampd_store_errors", "Shared-store calls that failed (degraded service)",
                                    registry=r)
        self.ttft = Histogram("ampd_ttft_seconds", "Time to first token, model seconds", registry=r,
                              buckets=_LATENCY_BUCKETS_S)
        self.itl = Histogram("ampd_itl_seconds", "Inter-token latency, model seconds", registry=r,
                             buckets=_LATENCY_BUCKETS_S)
        self.round_phase = Histogram("ampd_round_phase_seconds", "A round's TTFT by phase, model seconds "
                                     "(ampd.serve.rounds.phases.PHASES: each route's phases)",
                                     ["route", "phase"], registry=r, buckets=_LATENCY_BUCKETS_S)
        self.decision = Histogram("ampd_route_decision_seconds", "Wall time to read the shared state and route "
                                  "one prefill", registry=r, buckets=_DECISION_BUCKETS_S)
        self.kv_reserved = Gauge("ampd_kv_reserved_tokens", "KV tokens reserved on a decode engine: the sum over "
                                 "its sessions at the last audit", ["worker"], registry=r)
        self.kv_audit_repairs = Counter("ampd_kv_audit_repairs", "Decode engine KV totals the audit found different "
                                        "from the sum over their sessions, and repaired", ["worker"], registry=r)
        self.kv_audit_repaired_tokens = Counter("ampd_kv_audit_repaired_tokens", "Tokens by which repaired KV "
                                                "totals were off", registry=r)
        self.sessions_restored = Counter("ampd_sessions_restored", "Bindings given back to a store that restarted "
                                         "empty", registry=r)
        self.round_failures = Counter("ampd_round_failures", "Rounds that ended without their output, by cause "
                                      "(client: 4xx; server: 5xx; disconnect: the client left)", ["cause"],
                                      registry=r)
        self.worker_up = Gauge("ampd_worker_up", "1 when the engine answers its health check", ["worker"],
                               registry=r)

    def exposition(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
