"""What every part of one coordinator replica shares: its options, the engines,
the store, the clock, the decision log and the metrics, and whether the store
answered last time (``/health``'s ``degraded``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field

from ampd.core.deployment import Role
from ampd.perf.interface import PerfModel
from ampd.core.clock import ScaledClock
from ampd.serve.replica.decision_log import DecisionLog
from ampd.serve.replica.metrics import ServeMetrics
from ampd.serve.state.store import StateStore, StoreUnavailable, WorkerInfo

log = logging.getLogger(__name__)

# [our choice] A round's lease on its session (docs/SERVING.md, "KV reservations") lasts this
# many wall seconds and is renewed every ROUND_LEASE_RENEW_S while the round runs: a replica
# that dies mid-round frees its sessions within 5 s (its clients' retries elsewhere get 409
# until then); one stalled for up to 4 s keeps them. A lease that lapses costs no exactness:
# every reservation change reads the stored binding.
ROUND_LEASE_TTL_S = 5.0
ROUND_LEASE_RENEW_S = 1.0


@dataclass(frozen=True)
class CoordinatorOptions:
    """Knobs of one replica (``ServeConfig`` in ampd.config gives them).

    Attributes:
        replica_id: unique among the replicas sharing a store.
        model_name: the ``model`` field sent to the engines.
        kv_timeout_s: longest wait for a remote prefill (model s), then local recompute.
        admission_timeout_s: longest wait of a new session for KV room (model s).
        health_interval_s: engine health-check period, wall seconds.
        session_idle_ttl_s: a session idle this long (model s) is ended, for
            clients that never send ``X-Session-Last-Round``.
        stream_idle_timeout_s: a decode engine silent this long (model s) in
            the middle of a round counts as dead: the round moves on.
        kv_audit_interval_s: period of the KV reservation audit, wall seconds.
        session_block_tokens: tokens per hashed block of the prompt index
            (``ampd.serve.state.prompt_index``).
        history_read_min_tokens: ``vllm-nixl`` engines recompute rather than
            read a history shorter than this (their ``kv_recompute_threshold``);
            no export is asked for one.
        itl_slack_threshold_s: the ITL threshold the decode batches' slack is
            kept against (mean scope, ``decode_batch``), model seconds; None: no
            slack kept (strict scope).
    """

    replica_id: str
    model_name: str
    kv_timeout_s: float = 30.0
    admission_timeout_s: float = 120.0
    health_interval_s: float = 1.0
    session_idle_ttl_s: float = 600.0
    stream_idle_timeout_s: float = 60.0
    kv_audit_interval_s: float = 5.0
    session_block_tokens: int = 16
    history_read_min_tokens: int = 64
    itl_slack_threshold_s: float | None = None


@dataclass
class ReplicaContext:
    """One replica's shared parts.

    Attributes:
        workers: every engine by worker id.
        store: the shared state.
        perf: the cost model (``T_pre``, ``T_kv``, KV capacity per TP).
        clock: model time shared with the other replicas.
        options: see ``CoordinatorOptions``.
        decisions, metrics: where decisions and counters go.
        store_ok: False since a store call failed, until one succeeds.
    """

    workers: dict[int, WorkerInfo]
    store: StateStore
    perf: PerfModel
    clock: ScaledClock
    options: CoordinatorOptions
    decisions: DecisionLog
    metrics: ServeMetrics = field(default_factory=ServeMetrics)
    store_ok: bool = True

    def decide(self, kind: str, decision: object) -> None:
        """Log a decision under this replica's id."""
        self.decisions.add(kind, decision, replica=self.options.replica_id)

    @property
    def decode_ids(self) -> list[int]:
        """The decode workers' ids, ascending."""
        return sorted(i for i, w in self.workers.items() if w.spec.role is Role.DECODE)

    def kv_capacity_tokens(self, worker_id: int) -> int:
        """KV tokens a decode worker holds (from its TP and the cost model)."""
        return self.perf.kv_capacity_tokens(self.workers[worker_id].spec.tp)

    async def store_call(self, call: Awaitable) -> object | None:
        """Run a store call whose loss only degrades service; its result, or None
        when the store did not answer."""
        try:
            result = await call
        except StoreUnavailable as err:
            self.store_failed(err)
            return None
        self.store_ok = True
        return result

    def store_failed(self, err: StoreUnavailable) -> None:
        """Note a failed store call (``/health`` says degraded, a counter moves)."""
        self.store_ok = False
        self.metrics.store_errors.inc()
        log.warning("shared store unavailable, serving degraded: %s", err)
