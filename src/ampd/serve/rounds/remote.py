"""A round's remote prefill (AMPD.md section 3, step 3): the task joins the
coordinator-held queue of its prefill worker, whichever replica holds that
queue's lease sends it (``PrefillDispatcher``), and the result comes back on
this replica's channel. A prefill that fails or outlasts ``kv_timeout_s`` is
replaced by a local recompute on the decode worker (a *fallback*); one the
engine refuses as a bad request fails the round with the engine's 4xx instead:
the decode engine would refuse it too, and it is the client's error, not the
engine's."""

from __future__ import annotations

import asyncio
import json
import logging

from ampd.core.engine_kinds import EXPORTS_HISTORY
from ampd.core.view import ClusterView, QueuedTask
from ampd.policy.routing import remote_prefill_s
from ampd.serve.rounds.chat import PROMPT_CHECK_KEY, prompt_check
from ampd.serve.replica.context import ReplicaContext
from ampd.serve.rounds.dispatch import PrefillDispatcher
from ampd.engines.history_export import EXPORT_KEY, ExportRequest, kv_path
from ampd.serve.state.mirror import StateMirror
from ampd.serve.rounds.round import LiveRound, ServeError, engine_body
from ampd.serve.state.store import QueueEntry

log = logging.getLogger(__name__)


def is_client_error(status: int | None) -> bool:
    """An engine's refusal of the request itself (4xx), not of the moment
    (408 timeout, 429 too many requests: another engine may take it)."""
    return status is not None and 400 <= status < 500 and status not in (408, 429)


def fall_back(ctx: ReplicaContext, live: LiveRound, reason: str, detail: str | None = None) -> None:
    """Recompute the round locally on its decode worker instead (counted by reason)."""
    ctx.metrics.fallbacks.labels(reason).inc()
    ctx.decide("fallback", {"session_id": live.task.session_id, "round_index": live.task.round_index,
                            "prefill_worker": live.trace.prefill_worker, "reason": reason, "detail": detail})
    live.trace.fallback, live.trace.local = reason, True
    live.trace.prefill_worker, live.kv_params = live.trace.decode_worker, None


class RemotePrefill:
    """Queues remote prefills and waits for their KV.

    Args:
        ctx: the replica's shared parts.
        dispatcher: sends the queued tasks.
        mirror: this replica's mirror of the store, shown each enqueue at once (or None).
    """

    def __init__(self, ctx: ReplicaContext, dispatcher: PrefillDispatcher, mirror: StateMirror | None) -> None:
        self.ctx, self.dispatcher, self.mirror = ctx, dispatcher, mirror
        self._pending: dict[str, asyncio.Future] = {}

    async def run(self, live: LiveRound, view: ClusterView, worker_id: int) -> None:
        """Prefill ``live`` on ``worker_id``: sets ``live.kv_params`` for the
        decode engine, or falls back to a local recompute.

        Raises:
            ServeError: the prefill engine refused the request as a client error
                (its 4xx), or rendered a chat as another prompt (502, ``chat.prompt_mismatch``).
            StoreUnavailable: the task could not be queued.
        """
        ctx, task = self.ctx, live.task
        prefill, decode = view.worker(worker_id), view.worker(task.decode_worker)
        live.trace.local, live.trace.prefill_worker = False, worker_id
        entry = QueueEntry(QueuedTask(task, ctx.clock.now_s(), remote_prefill_s(task, decode, prefill, ctx.perf)),
                           ctx.options.replica_id)
        body = engine_body(live.request, ctx.options.model_name, live.request.prompt, 1, stream=False)
        body["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False}
        if live.request.chat:
            body[PROMPT_CHECK_KEY] = prompt_check(live.request.prompt, live.request.tokenizer_worker)
        exports = EXPORTS_HISTORY[ctx.workers[worker_id].kind] and task.hist_tokens >= max(
            ctx.options.history_read_min_tokens, 1)
        if exports:  # a chat body has no prompt ids: the export gets the history's
            history_ids = list(live.request.prompt[:task.hist_tokens]) if live.request.chat else None
            body[EXPORT_KEY] = ExportRequest(ctx.workers[task.decode_worker].url, task.hist_tokens,
                                             history_ids).to_dict()
        elif prefill.reads_history:  # the mock engine is told where the history KV lives
            body["kv_transfer_params"].update(ampd_hist_tokens=task.hist_tokens, ampd_decode_tp=decode.spec.tp,
                                              ampd_decode_server=decode.spec.server)
        result = asyncio.get_running_loop().create_future()
        self._pending[entry.key] = result
        try:
            await ctx.store.push(worker_id, entry, json.dumps(body))
            if self.mirror is not None:
                self.mirror.note_queued(worker_id, entry)
            await self.dispatcher.kick(worker_id)
            message = await asyncio.wait_for(result, ctx.clock.wall_s(ctx.options.kv_timeout_s))
        except TimeoutError:
            await ctx.store.withdraw(worker_id, entry)
            fall_back(ctx, live, "timeout")
            return
        finally:
            self._pending.pop(entry.key, None)
        live.trace.kv_ready_s, live.trace.remote_phases_s = ctx.clock.now_s(), message.get("phases_s") or {}
        if message["ok"]:
            live.kv_params = message.get("kv_transfer_params") or {}
            if exports:
                self._note_kv_path(live, worker_id, message)
        elif message.get("reason") == "prompt-mismatch":
            raise ServeError(502, message["error"])
        elif is_client_error(message.get("status")):
            raise ServeError(message["status"], f"prefill engine {worker_id} refused the request: {message['error']}")
        elif message.get("reason") == "timeout":
            fall_back(ctx, live, "timeout", message.get("error"))
        else:  # with an exported history, an engine failure is (nearly always) the read
            fall_back(ctx, live, "history-read-failed" if exports else "prefill-failed", message.get("error"))

    def _note_kv_path(self, live: LiveRound, worker_id: int, message: dict) -> None:
        """Log which path the history took (``kv-path`` decisions) and count a
        history that was not read as a fallback by reason."""
        task, export = live.task, message.get("export")
        path, reason = kv_path(task.hist_tokens, export, message.get("cached_tokens", 0),
                               self.ctx.options.history_read_min_tokens)
        self.ctx.decide("kv-path", {"session_id": task.session_id, "round_index": task.round_index,
                                    "prefill_worker": worker_id, "path": path, "history_tokens": task.hist_tokens,
                                    "prefill_cached_tokens": message.get("cached_tokens"),
                                    "decode_cached_tokens": export and export["decode_cached_tokens"],
                                    "reason": reason, "detail": export and export["error"]})
        if reason is not None:
            self.ctx.metrics.fallbacks.labels(reason).inc()
            log.warning("session %s round %d: %s (%s)", task.session_id, task.round_index, reason,
                        (export and export["error"]) or path)

    def on_result(self, message: dict) -> None:
        """A prefill's outcome, published by the replica that dispatched it."""
        result = self._pending.get(message.get("key"))
        if result is not None and not result.done():
            result.set_result(message)
