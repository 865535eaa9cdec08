"""Shared serving state: what coordinator replicas must agree on (the worker
registry, session bindings, per-worker prefill queues, windowed statistics,
dispatch leases) and the ``StateStore`` interface that holds it, in one
process (``MemoryStore``) or in Redis (``RedisStore``).

Times are model seconds from the replicas' common ``ScaledClock``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from ampd.core.deployment import Role, WorkerSpec
from ampd.core.errors import AmpdError
from ampd.core.task import PrefillTask
from ampd.core.view import QueuedTask


class StoreUnavailable(AmpdError):
    """The shared store cannot be reached; the caller degrades (docs/SERVING.md)."""


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """One engine in the registry.

    Attributes:
        spec: id, role, TP and server of the worker.
        url: base URL of its OpenAI-compatible engine server.
        kind: ``"mock"`` or ``"vllm"`` (what it can do: docs/SERVING.md).
    """

    spec: WorkerSpec
    url: str
    kind: str = "mock"

    def to_json(self) -> str:
        s = self.spec
        return json.dumps({"worker_id": s.worker_id, "role": s.role.value, "tp": s.tp, "server": s.server,
                           "url": self.url, "kind": self.kind})

    @classmethod
    def from_json(cls, text: str) -> WorkerInfo:
        d = json.loads(text)
        return cls(WorkerSpec(d["worker_id"], Role(d["role"]), d["tp"], d["server"]), d["url"], d["kind"])


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """A prefill task queued at (or dispatched to) one worker.

    Attributes:
        queued: the task, its enqueue time and predicted cost on that worker;
            ``postponements`` is kept by the store beside the entry.
        owner: id of the coordinator replica holding the client's request, to
            which the prefill's result is published.
        dispatch_s: when it was sent to the engine (None while waiting).
    """

    queued: QueuedTask
    owner: str
    dispatch_s: float | None = None

    @property
    def key(self) -> str:
        """``<session id>#<round index>``: unique per task."""
        return task_key(self.queued.task.session_id, self.queued.task.round_index)

    def to_json(self) -> str:
        """The entry without its postponement counter (kept apart, so the text
        stays the same while it waits)."""
        t, q = self.queued.task, self.queued
        return json.dumps([t.session_id, t.round_index, t.hist_tokens, t.new_tokens, t.ready_s, t.decode_worker,
                           q.enqueue_s, q.cost_s, self.owner, self.dispatch_s])

    @classmethod
    def from_json(cls, text: str, postponements: int = 0) -> QueueEntry:
        return cls.from_list(json.loads(text), postponements)

    @classmethod
    def from_list(cls, values: list, postponements: int = 0) -> QueueEntry:
        """From the decoded JSON array of ``to_json``."""
        sid, rnd, hist, new, ready_s, dw, enq_s, cost_s, owner, dispatch_s = values
        task = PrefillTask(sid, rnd, hist, new, ready_s, dw)
        return cls(QueuedTask(task, enq_s, cost_s, postponements), owner, dispatch_s)


BOUND, TAKEN, FULL = "bound", "taken", "full"


def task_key(session_id: str, round_index: int) -> str:
    """The key of a round's prefill task."""
    return f"{session_id}#{round_index}"


@dataclass(frozen=True, slots=True)
class BatchReport:
    """One replica's part of a decode worker's batch: the rounds it streams from
    that worker (``ampd.serve.rounds.decode_batch``).

    Attributes:
        batch_size: sequences streaming.
        context_tokens: KV tokens they hold (prompt and output so far).
        min_itl_slack_s: their smallest ITL slack, seconds (mean scope,
            ``WorkerView.min_itl_slack_s``); None when not kept (strict scope) or
            ``batch_size`` is 0.
        as_of_s: when it was measured, model seconds.
    """

    batch_size: int
    context_tokens: int
    min_itl_slack_s: float | None
    as_of_s: float

    def to_list(self) -> list:
        return [self.batch_size, self.context_tokens, self.min_itl_slack_s, self.as_of_s]

    @classmethod
    def from_list(cls, values: list) -> BatchReport:
        return cls(*values)


@dataclass(slots=True)
class WorkerState:
    """One worker as the store holds it.

    Attributes:
        worker_id: the worker.
        alive: False once marked dead (health check or failed call).
        queue: waiting prefill tasks, queue order (prefill workers).
        inflight: dispatched prefills not yet finished (prefill workers), or
            local prefills not yet at their first token (decode workers).
        ttft_mean_s, itl_mean_s: windowed mean TTFT (prefill workers) and ITL
            (decode workers), None when the window is empty.
        kv_used_tokens: KV reserved by the sessions bound to it (decode workers).
        batches: the last ``BatchReport`` of each replica streaming from it
            (decode workers), by replica id, stale ones included.
    """

    worker_id: int
    alive: bool = True
    queue: list[QueueEntry] = field(default_factory=list)
    inflight: list[QueueEntry] = field(default_factory=list)
    ttft_mean_s: float | None = None
    itl_mean_s: float | None = None
    kv_used_tokens: int = 0
    batches: dict[str, BatchReport] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SessionState:
    """A session's binding.

    Attributes:
        decode_worker: the decode worker holding its KV.
        held_tokens: KV tokens of its finished rounds (prompt + output of the last one).
        reserved_tokens: KV tokens counted against the worker's memory for it;
            the worker's total is the sum of this over its sessions (docs/SERVING.md,
            "KV reservations").
        num_rounds: rounds started so far.
        last_s: when it last started or finished a round, model seconds.
        scope: fingerprint of the API key that created it ("" without keys);
            rounds under another key are refused.
        itl_slack_s: its ITL slack after its finished rounds, seconds (mean scope:
            the ITL threshold times its token gaps minus their sum; 0 where not kept).
    """

    decode_worker: int
    held_tokens: int = 0
    reserved_tokens: int = 0
    num_rounds: int = 0
    last_s: float = 0.0
    scope: str = ""
    itl_slack_s: float = 0.0

    def to_json(self) -> str:
        return json.dumps([self.decode_worker, self.held_tokens, self.reserved_tokens, self.num_rounds, self.last_s,
                           self.scope, self.itl_slack_s])

    @classmethod
    def from_json(cls, text: str) -> SessionState:
        return cls(*json.loads(text))


# Outcomes of the session operations (``StateStore``).
STARTED, MISSING, BUSY, FORBIDDEN, DONE, LOST = "started", "missing", "busy", "forbidden", "done", "lost"


@dataclass(frozen=True, slots=True)
class RoundStart:
    """What ``StateStore.start_round`` did.

    Attributes:
        outcome: ``STARTED`` (the lease is the caller's, the round counted in),
            ``MISSING`` (no binding: bind it), ``BUSY`` (another round holds the
            session), ``FORBIDDEN`` (the session belongs to another scope).
        before, after: the binding before and after, when ``STARTED``.
    """

    outcome: str
    before: SessionState | None = None
    after: SessionState | None = None


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """What the prompt index holds of one round of a session found from its
    prompts (``ampd.serve.state.prompt_index``): the round's prompt and that prompt
    followed by the round's output, each as a length and a hash of the tokens
    after the entry's block-aligned key.

    Attributes:
        session_id: the session.
        prompt_tokens, prompt_hash: the round's prompt.
        history_tokens, history_hash: that prompt and the output the decode
            engine generated for it (what the engine's KV held after it).
        round_index: the round (0 for the first).
        latest: whether it is its session's latest round (a prompt that extends
            an earlier one diverged from what the decode engine holds now).
    """

    session_id: str
    prompt_tokens: int
    prompt_hash: str
    history_tokens: int
    history_hash: str
    round_index: int
    latest: bool = True

    def to_list(self) -> list:
        return [self.session_id, self.prompt_tokens, self.prompt_hash, self.history_tokens, self.history_hash,
                self.round_index, int(self.latest)]

    @classmethod
    def from_list(cls, values: list) -> HistoryEntry:
        return cls(*values[:6], latest=bool(values[6]))


ResultHandler = Callable[[dict], Awaitable[None] | None]


class StateStore(Protocol):
    """Shared state of the coordinator replicas. Every method may raise
    ``StoreUnavailable``. Implementations: ``MemoryStore``, ``RedisStore``;
    both take the statistics' window length, seconds, when built."""

    async def ping(self) -> None:
        """Raise ``StoreUnavailable`` unless the store answers."""

    async def register_workers(self, workers: list[WorkerInfo]) -> None:
        """Add (or replace) registry entries; registering marks a worker alive."""

    async def workers(self) -> list[WorkerInfo]:
        """The registry, in worker id order."""

    async def snapshot(self, worker_ids: list[int], now_s: float) -> list[WorkerState]:
        """The state of ``worker_ids`` now (windows end at ``now_s``), in one round trip."""

    async def set_alive(self, worker_id: int, alive: bool) -> None:
        """Mark a worker alive or dead."""

    async def sessions(self) -> dict[str, SessionState]:
        """Every binding, by session id (audits, tests)."""

    async def bind_session(self, session_id: str, state: SessionState, capacity_tokens: int, lease: str,
                           lease_ttl_s: float) -> str:
        """Bind a new session, reserve ``state.reserved_tokens`` on its worker and
        lease its first round to ``lease`` for ``lease_ttl_s`` wall seconds, in one
        step that checks the worker's total stays within ``capacity_tokens``.
        ``BOUND``; or, with nothing changed, ``TAKEN`` (bound meanwhile), ``BUSY``
        (another round holds its lease) or ``FULL`` (the worker filled up)."""

    async def start_round(self, session_id: str, scope: str, lease: str, lease_ttl_s: float, need_tokens: int,
                          now_s: float) -> RoundStart:
        """Take a bound session's round lease and count the round in, in one step:
        its reservation grows to ``need_tokens`` if below (the worker's total moves
        by the difference with the *stored* reservation), ``num_rounds`` + 1,
        ``last_s = now_s``. A session held by another lease is ``BUSY``; one
        created under another ``scope`` is ``FORBIDDEN``; both change nothing."""

    async def move_session(self, session_id: str, lease: str, state: SessionState, capacity_tokens: int,
                           lease_ttl_s: float) -> str:
        """Replace the binding of a session whose round ``lease`` holds (a rebind),
        checking the new worker's capacity; both workers' totals move by the
        stored reservation. ``DONE``, ``FULL`` or ``LOST`` (nothing changed:
        another lease holds it, or it has a later round than ``state``'s)."""

    async def close_round(self, session_id: str, lease: str, state: SessionState | None, num_rounds: int) -> str:
        """A round's last write: replace the binding with ``state`` (None: drop the
        session), the worker totals moving by the difference with the stored
        reservation (a binding the store lost is added back), and release the
        lease. ``num_rounds``: the rounds the session had with this one. ``DONE``,
        or ``LOST`` (nothing changed) when another lease holds the session or a
        later round wrote it; so a write repeated after a lost reply is harmless.
        A lease that expired counts as still the caller's."""

    async def renew_leases(self, leases: dict[str, str], lease_ttl_s: float) -> list[str]:
        """Extend the round leases ``{session id: lease}`` (taking back one that
        vanished, e.g. a restarted store: so a caller never renews a lease whose
        round it has closed, ``SessionBook._write``); the ids whose lease another holds."""

    async def expire_sessions(self, idle_before_s: float) -> list[str]:
        """End the sessions with no round leased whose last round started or
        finished before ``idle_before_s`` (freeing their reserved KV); their ids."""

    async def audit_kv(self, worker_ids: list[int]) -> dict[int, tuple[int, int]]:
        """Recompute each worker's reserved KV as the sum over its sessions and
        repair the stored total where it differs, in one step;
        ``{worker: (stored total, derived total)}``, tokens, for ``worker_ids``
        and any other worker a session is bound to."""

    async def restore_sessions(self, states: dict[str, SessionState]) -> list[str]:
        """Add back bindings the store lost (a restart): each one missing is added,
        one with fewer rounds and no lease replaced, totals adjusted; the ids written."""

    async def index_history(self, session_id: str, key: str, entry: HistoryEntry, max_entries_per_key: int,
                            max_entries_per_session: int, kept_to_round: int) -> bool:
        """File ``entry`` (its ``latest`` true) under ``key`` (a block-aligned
        prefix hash) as the latest entry of ``session_id``, in one step: the
        session's earlier entries of rounds up to ``kept_to_round`` stay,
        ``latest`` false, the oldest dropped beyond ``max_entries_per_session``;
        those of later rounds (a branch the new entry left) are dropped; a key already holding
        ``max_entries_per_key`` entries drops its oldest (that round of that
        session is then no longer found). False, with nothing written, when the
        session has no binding (it ended meanwhile). Every change that drops a
        binding (last round, expiry) drops its entries too."""

    async def history_entries(self, keys: list[str]) -> list[list[HistoryEntry]]:
        """The entries filed under each of ``keys`` (in that order; [] for a key
        holding none), in one round trip."""

    async def epoch(self) -> str:
        """An id of the store's contents, the same until it loses them (restart)."""

    async def push(self, worker_id: int, entry: QueueEntry, payload: str) -> None:
        """Append a task (and the request body to send, ``payload``) to a worker's queue."""

    async def set_postponements(self, worker_id: int, counts: dict[str, int]) -> None:
        """Store Algorithm 2's postponement counters by task key."""

    async def take(self, worker_id: int, entry: QueueEntry, dispatch_s: float) -> tuple[QueueEntry, str] | None:
        """Move a waiting task (``entry`` as a snapshot or ``push`` gave it) to the
        worker's in-flight set; its in-flight entry and payload, or None when it is
        no longer queued (withdrawn, or taken by another replica)."""

    async def withdraw(self, worker_id: int, entry: QueueEntry) -> bool:
        """Remove a waiting task; False when it was not waiting (already dispatched)."""

    async def add_inflight(self, worker_id: int, entry: QueueEntry) -> None:
        """Record a task running on a worker (a local prefill sent to a decode engine)."""

    async def remove_inflight(self, worker_id: int, key: str) -> None:
        """Forget a finished (or failed) in-flight task."""

    async def add_samples(self, worker_id: int, kind: str, now_s: float, total_s: float, count: int) -> None:
        """Add ``count`` latency samples summing to ``total_s`` to a worker's
        ``kind`` window (``"ttft"`` or ``"itl"``)."""

    async def report_batch(self, worker_id: int, replica_id: str, report: BatchReport) -> None:
        """Replace replica ``replica_id``'s report of the batch it streams from
        decode worker ``worker_id`` (``WorkerState.batches``). Not announced on a
        change feed: the same replica's ITL samples of that worker are."""

    async def drop_batch_reports(self, worker_id: int, before_s: float) -> int:
        """Remove decode worker ``worker_id``'s batch reports measured before
        ``before_s`` (model seconds): those of replicas that stopped. Returns how
        many were removed."""

    async def acquire_lease(self, worker_id: int, owner: str, ttl_s: float) -> bool:
        """Take the right to dispatch a worker's queue for ``ttl_s`` wall seconds;
        False when another owner holds it."""

    async def release_lease(self, worker_id: int, owner: str) -> None:
        """Give the lease back if ``owner`` holds it."""

    async def publish(self, owner: str, message: dict) -> None:
        """Deliver ``message`` to replica ``owner``'s result handler."""

    async def subscribe(self, owner: str, handler: ResultHandler) -> None:
        """Deliver the messages published to ``owner`` to ``handler`` until ``close``."""

    async def close(self) -> None:
        """Release connections and background tasks."""
