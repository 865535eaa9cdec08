"""Round delivery (AMPD.md section 3, step 4): stream a round's output from its
decode engine to the client, and recover from what goes wrong on the way
(docs/SERVING.md, "Failures"): a decode engine that cannot load the prefill's
KV gets the round again without it (local recompute); a decode engine that
dies or hangs is marked dead, the session moves to another one and the round
continues there after the tokens already sent; an engine's refusal of the
request (4xx) goes back to the client as it is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ampd.core.view import QueuedTask
from ampd.serve.rounds.chat import prompt_check, prompt_mismatch
from ampd.serve.replica.context import ReplicaContext
from ampd.serve.rounds.decode_batch import DecodeBatches
from ampd.engines.client import Chunk, EngineClient, EngineError
from ampd.serve.replica.health import EngineHealth
from ampd.serve.rounds.windows import LatencyWindows
from ampd.serve.rounds.remote import fall_back, is_client_error
from ampd.serve.rounds.round import LiveRound, ServeError, engine_body
from ampd.serve.rounds.sessions import SessionBook, need_tokens
from ampd.serve.state.store import QueueEntry, StoreUnavailable


class RoundDelivery:
    """Streams rounds from decode engines.

    Args:
        ctx: the replica's shared parts.
        engines: the HTTP client.
        health: marks engines dead.
        sessions: moves a session off a dead engine.
        windows: where TTFT and ITL samples go.
        batches: the decode batches a round streams in.
    """

    def __init__(self, ctx: ReplicaContext, engines: EngineClient, health: EngineHealth, sessions: SessionBook,
                 windows: LatencyWindows, batches: DecodeBatches) -> None:
        self.ctx, self.engines, self.health, self.sessions, self.windows = ctx, engines, health, sessions, windows
        self.batches = batches

    async def deliver(self, live: LiveRound) -> AsyncIterator[Chunk]:
        """The round's chunks, across as many attempts as failures need (one per
        worker, plus two). A completion goes on after a dead engine's last token
        on the next (its prompt and output so far as the new prompt); a chat
        round starts again there if nothing of it went out yet.

        Raises:
            ServeError: the engine refused the request (its 4xx), or every
                attempt failed (502), or no engine could take the session (503),
                or a chat round's engine died after it spoke (502), or rendered
                another prompt than the coordinator counted (502).
        """
        emitted: list[int] = []
        spoke = False  # a chunk went out (a chat parser may speak before a token counts)
        model = self.ctx.options.model_name
        for _ in range(len(self.ctx.workers) + 2):
            body = engine_body(live.request, model, live.request.prompt + tuple(emitted),
                               live.request.max_tokens - len(emitted), stream=True)
            if live.kv_params is not None and not emitted:
                body["kv_transfer_params"] = live.kv_params
            try:
                async for chunk in self._stream_once(live, body, not emitted):
                    emitted.extend(chunk.token_ids)
                    spoke = True
                    yield chunk
                return
            except EngineError as err:
                failed = live.trace.decode_worker
                await self._recover(live, err, emitted)
                if live.request.chat and spoke:  # the session is rebound: the round sent again is served
                    raise ServeError(502, f"decode engine {failed} failed mid-reply; a chat reply cannot be resumed "
                                          "token for token (the engine's parsers hold its state): send the round "
                                          "again") from None
        raise ServeError(502, f"round {live.task.round_index} of session {live.task.session_id}: the decode engines "
                              "kept failing")

    async def _stream_once(self, live: LiveRound, body: dict, first: bool) -> AsyncIterator[Chunk]:
        worker_id = live.trace.decode_worker
        in_batch, tracked, untracked = False, None, None
        if first and live.trace.local and not live.trace.degraded:
            # Written while the engine request goes out, and taken out after the first
            # token went to the client: neither store round trip holds the first token back
            # (a replica routing in the round trip's time sees the queue without it).
            tracked = asyncio.ensure_future(self._track_local(live))
        check = prompt_check(live.request.prompt, live.request.tokenizer_worker) if live.request.chat else None
        try:
            async for chunk in self.engines.stream(self.ctx.workers[worker_id].url, body, live.task.session_id,
                                                   live.request.last_round):
                if check is not None and "prompt_token_ids" in chunk.event:
                    problem = prompt_mismatch(check, chunk.event["prompt_token_ids"], "decode", worker_id)
                    if problem:
                        raise ServeError(502, problem)
                if chunk.token_ids:
                    if not in_batch:
                        in_batch = True
                        self.batches.joined(live)
                    if live.trace.first_token_s is None:
                        await self.windows.first_token(live.trace, len(chunk.token_ids))
                        if tracked is not None:  # the local prefill is done: out of the worker's queue
                            untracked, tracked = asyncio.ensure_future(self._untrack_local(worker_id, tracked)), None
                    else:
                        self.windows.later_tokens(live.trace, len(chunk.token_ids))
                    yield chunk
                elif chunk.says_something:
                    yield chunk
                elif chunk.event.get("usage"):
                    live.usage = chunk.event["usage"]
        finally:
            if in_batch:
                self.batches.left(live)
            if tracked is not None:
                untracked = asyncio.ensure_future(self._untrack_local(worker_id, tracked))
            if untracked is not None:  # the round ends with its queue entry gone (shielded: see _round)
                await asyncio.shield(untracked)

    async def _untrack_local(self, worker_id: int, tracked: asyncio.Future) -> None:
        """Take a local prefill out of its decode worker's queue once it is in."""
        await self.ctx.store_call(self.ctx.store.remove_inflight(worker_id, await tracked))

    async def _track_local(self, live: LiveRound) -> str:
        """Count a local prefill in its decode worker's queue until its first token."""
        task = live.task
        cost_s = self.ctx.perf.prefill_s(task.hist_tokens, task.new_tokens, self.ctx.workers[task.decode_worker].spec.tp)
        entry = QueueEntry(QueuedTask(task, self.ctx.clock.now_s(), cost_s), self.ctx.options.replica_id)
        await self.ctx.store_call(self.ctx.store.add_inflight(live.trace.decode_worker, entry))
        return entry.key

    async def _recover(self, live: LiveRound, err: EngineError, emitted: list[int]) -> None:
        """Prepare the next attempt after ``err``, or raise when none can help."""
        worker_id = live.trace.decode_worker
        if err.reason == "status" and live.kv_params is not None and not emitted and not is_client_error(err.status):
            fall_back(self.ctx, live, "kv-load-failed", err.message)
            return
        if not err.engine_down:
            if is_client_error(err.status):
                raise ServeError(err.status, f"decode engine {worker_id} refused the request: {err.message}")
            raise ServeError(502, f"decode engine {worker_id} failed the round: {err.reason}: {err.message}")
        await self.health.mark_dead(worker_id)
        session_id = live.task.session_id
        try:
            live.state = await self.sessions.rebind(session_id, need_tokens(live.request))
        except StoreUnavailable as store_err:
            self.ctx.store_failed(store_err)
            live.state = self.sessions.move_degraded(session_id)
            live.trace.degraded = True
        live.trace.decode_worker = live.trace.prefill_worker = live.state.decode_worker
        live.trace.local, live.kv_params = True, None
        live.trace.rebinds += 1
