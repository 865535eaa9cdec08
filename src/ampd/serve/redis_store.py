"""The shared state of coordinator replicas in Redis (standalone server; the
scripts touch keys they compute, which Redis Cluster would refuse).

Layout, every key under ``prefix`` (default ``ampd:``):

| key | type | holds |
|---|---|---|
| ``workers`` | hash | registry: worker id -> WorkerInfo JSON |
| ``w:<worker>`` | hash | the worker's small state, one field each: ``dead`` (present when dead), ``kv`` (KV tokens reserved), ``win:<kind>:<slot>`` (``bucket|sum|count``), ``postp:<task>`` (postponements), ``infl:<task>`` (in-flight entry JSON) |
| ``q:<worker>`` | list | waiting entries (JSON), queue order |
| ``qp:<worker>`` | hash | task key -> request body to send |
| ``sessions`` | hash | session id -> SessionState JSON (``[worker, held, reserved, rounds, last_s, scope]``) |
| ``round:<session>`` | string | the lease of the session's round in flight (expires) |
| ``lease:<worker>`` | string | replica id allowed to dispatch the queue (expires) |
| ``epoch`` | string | an id of the store's contents: a new one after a restart that lost them |
| ``hidx`` | hash | prompt index (``ampd.serve.prompt_index``): prefix hash -> JSON list of ``HistoryEntry`` lists, oldest first |
| ``hses`` | hash | session id -> JSON list of ``[hidx field, round]`` of its entries, oldest first |
| channel ``results:<replica>`` | pub/sub | prefill results for that replica |
| channel ``changes`` | pub/sub | ids of workers whose state changed (``StateMirror``) |
| channel ``owners`` | pub/sub | ``[session, replica]`` when a replica starts a round of a session |

One hash per worker keeps a routing snapshot at two reads per worker in one
script (the routing-time benchmark, bench/bench_serve_routing.py). Windows are
bucketed: ``BUCKETS`` buckets of ``window_s / BUCKETS`` seconds each, so the mean
covers the last ``window_s`` seconds to within one bucket ([our choice]: bounded
memory whatever the rate). Every multi-key change is one Lua script, hence
atomic across replicas.

KV reservations: a worker's ``kv`` field is changed only by the scripts that
change a binding in ``sessions``, by the difference between the new reservation
and the one stored (read inside the script), so no replica's copy of a session
can make it drift; ``_AUDIT`` recomputes every total from ``sessions``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import math
import uuid
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from ampd.core.view import QueuedTask
from ampd.serve.store import (STARTED, BatchReport, HistoryEntry, QueueEntry, ResultHandler, RoundStart, SessionState,
                              StoreUnavailable, WorkerInfo, WorkerState)

log = logging.getLogger(__name__)

BUCKETS = 10
ENTRY_CACHE_SIZE = 100_000  # decoded queue entries kept between snapshots

# One JSON document for all the workers asked for (parsed by one json.loads), the
# windows already summed over the buckets newer than ARGV[2]:
# [[[entry, ...], dead, kv, ttft_sum, ttft_count, itl_sum, itl_count, [task, n, ...], [in-flight entry, ...],
#   [replica, batch report, ...]], ...]
_SNAPSHOT = """
local p, oldest = ARGV[1], tonumber(ARGV[2])
local parts = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local fields = redis.call('HGETALL', p .. 'w:' .. id)
  local dead, kv = 0, '0'
  local sums = {ttft = {0, 0}, itl = {0, 0}}
  local postponed, inflight, batches = {}, {}, {}
  for j = 1, #fields, 2 do
    local name, value = fields[j], fields[j + 1]
    local kind = string.match(name, '^win:(%a+):')
    if kind then
      local b, s, n = string.match(value, '([^|]+)|([^|]+)|([^|]+)')
      if tonumber(b) > oldest and sums[kind] then
        sums[kind][1] = sums[kind][1] + tonumber(s); sums[kind][2] = sums[kind][2] + tonumber(n)
      end
    elseif name == 'kv' then kv = value
    elseif name == 'dead' then dead = 1
    elseif string.sub(name, 1, 6) == 'postp:' then
      postponed[#postponed + 1] = cjson.encode(string.sub(name, 7)) .. ',' .. value
    elseif string.sub(name, 1, 5) == 'infl:' then inflight[#inflight + 1] = value
    elseif string.sub(name, 1, 6) == 'batch:' then
      batches[#batches + 1] = cjson.encode(string.sub(name, 7)) .. ',' .. value
    end
  end
  parts[#parts + 1] = '[[' .. table.concat(redis.call('LRANGE', p .. 'q:' .. id, 0, -1), ',') .. '],' ..
    dead .. ',' .. kv .. ',' .. string.format('%.17g,%d,%.17g,%d', sums.ttft[1], sums.ttft[2], sums.itl[1],
    sums.itl[2]) .. ',[' .. table.concat(postponed, ',') .. '],[' .. table.concat(inflight, ',') .. '],[' ..
    table.concat(batches, ',') .. ']]'
end
return '[' .. table.concat(parts, ',') .. ']'
"""

# Every script that changes a worker's state announces it on the change feed itself
# (its last two ARGV: the channel and the worker id), in the same round trip.

# Session scripts. A binding is ``[worker, held, reserved, rounds, last_s, scope]``; each
# script moves the workers' ``kv`` totals by what it changes in the binding as stored.
_SESSION_LIB = """
local p = ARGV[1]
local function kv(worker, delta)
  if delta ~= 0 then
    redis.call('HINCRBY', p .. 'w:' .. worker, 'kv', string.format('%d', delta))
    redis.call('PUBLISH', p .. 'changes', tostring(worker))
  end
end
-- The prompt index: hidx[key] = entries (``HistoryEntry.to_list``: [1] session, [6] round,
-- [7] 1 while its session's latest); hses[session] = [key, round] of each of its entries,
-- oldest first.
local function filter(key, keep)
  local text = redis.call('HGET', p .. 'hidx', key)
  if not text then return end
  local kept = {}
  for _, e in ipairs(cjson.decode(text)) do
    if keep(e) then kept[#kept + 1] = e end
  end
  if #kept > 0 then redis.call('HSET', p .. 'hidx', key, cjson.encode(kept))
  else redis.call('HDEL', p .. 'hidx', key) end
end
local function filed(sid)
  local text = redis.call('HGET', p .. 'hses', sid)
  return text and cjson.decode(text) or {}
end
local function unindex(sid)
  local mine = filed(sid)
  redis.call('HDEL', p .. 'hses', sid)
  local done = {}
  for _, pair in ipairs(mine) do
    if not done[pair[1]] then
      done[pair[1]] = true
      filter(pair[1], function(e) return e[1] ~= sid end)
    end
  end
end
local function put(sid, old, text)
  local new = text and cjson.decode(text)
  if old and new and old[1] == new[1] then kv(new[1], new[3] - old[3])
  else
    if old then kv(old[1], -old[3]) end
    if new then kv(new[1], new[3]) end
  end
  if new then redis.call('HSET', p .. 'sessions', sid, text)
  else
    redis.call('HDEL', p .. 'sessions', sid)
    unindex(sid)
  end
end
local function stored(sid)
  local text = redis.call('HGET', p .. 'sessions', sid)
  return text and cjson.decode(text)
end
local function owner(sid, replica)
  redis.call('PUBLISH', p .. 'owners', cjson.encode({sid, replica}))
end
"""

# ARGV: prefix, session, state JSON, capacity, lease, lease ms, replica
_BIND = _SESSION_LIB + """
local sid, new = ARGV[2], cjson.decode(ARGV[3])
local lease_key = p .. 'round:' .. sid
if redis.call('HEXISTS', p .. 'sessions', sid) == 1 then return 'taken' end
local holder = redis.call('GET', lease_key)
if holder and holder ~= ARGV[5] then return 'busy' end
if tonumber(redis.call('HGET', p .. 'w:' .. new[1], 'kv') or '0') + new[3] > tonumber(ARGV[4]) then return 'full' end
put(sid, nil, ARGV[3])
redis.call('SET', lease_key, ARGV[5], 'PX', ARGV[6])
owner(sid, ARGV[7])
return 'bound'
"""

# ARGV: prefix, session, scope, lease, lease ms, need tokens, now, replica
_START = _SESSION_LIB + """
local sid = ARGV[2]
local text = redis.call('HGET', p .. 'sessions', sid)
if not text then return {'missing'} end
local s = cjson.decode(text)
if (s[6] or '') ~= ARGV[3] then return {'forbidden'} end
if not redis.call('SET', p .. 'round:' .. sid, ARGV[4], 'NX', 'PX', ARGV[5]) then return {'busy'} end
local old = cjson.decode(text)
s[3] = math.max(s[3], tonumber(ARGV[6]))
s[4] = s[4] + 1
s[5] = tonumber(ARGV[7])
local after = cjson.encode(s)
put(sid, old, after)
owner(sid, ARGV[8])
return {'started', text, after}
"""

# ARGV: prefix, session, lease, state JSON ('' to drop), capacity ('' unchecked), lease ms ('0' to release),
# the writer's round count (a binding with more rounds was written by a later round: left alone)
_PUT = _SESSION_LIB + """
local sid = ARGV[2]
local lease_key = p .. 'round:' .. sid
local holder = redis.call('GET', lease_key)
if holder and holder ~= ARGV[3] then return 'lost' end
local old = stored(sid)
if old and old[4] > tonumber(ARGV[7]) then return 'lost' end
local text = ARGV[4] ~= '' and ARGV[4] or nil
if text and ARGV[5] ~= '' then
  local new = cjson.decode(text)
  local used = tonumber(redis.call('HGET', p .. 'w:' .. new[1], 'kv') or '0')
  if old and old[1] == new[1] then used = used - old[3] end
  if used + new[3] > tonumber(ARGV[5]) then return 'full' end
end
put(sid, old, text)
if ARGV[6] == '0' then redis.call('DEL', lease_key) else redis.call('SET', lease_key, ARGV[3], 'PX', ARGV[6]) end
return 'done'
"""

# ARGV: prefix, lease ms, then session, lease pairs
_RENEW = """
local lost = {}
for i = 3, #ARGV, 2 do
  local key = ARGV[1] .. 'round:' .. ARGV[i]
  local holder = redis.call('GET', key)
  if holder == ARGV[i + 1] then redis.call('PEXPIRE', key, ARGV[2])
  elseif not holder then redis.call('SET', key, ARGV[i + 1], 'PX', ARGV[2])
  else lost[#lost + 1] = ARGV[i] end
end
return lost
"""

# ARGV: prefix, idle before (model s)
_EXPIRE = _SESSION_LIB + """
local ended = {}
local all = redis.call('HGETALL', p .. 'sessions')
for i = 1, #all, 2 do
  local sid, s = all[i], cjson.decode(all[i + 1])
  if s[5] < tonumber(ARGV[2]) and redis.call('EXISTS', p .. 'round:' .. sid) == 0 then
    put(sid, s, nil)
    ended[#ended + 1] = sid
  end
end
return ended
"""

# ARGV: prefix, worker ids; returns 'worker,stored,derived' of each worker, the stored total repaired
_AUDIT = """
local p = ARGV[1]
local sums = {}
for i = 2, #ARGV do sums[ARGV[i]] = 0 end
for _, text in ipairs(redis.call('HVALS', p .. 'sessions')) do
  local s = cjson.decode(text)
  local w = string.format('%d', s[1])
  sums[w] = (sums[w] or 0) + s[3]
end
local totals = {}
for w, derived in pairs(sums) do
  local stored = tonumber(redis.call('HGET', p .. 'w:' .. w, 'kv') or '0')
  if stored ~= derived then
    redis.call('HSET', p .. 'w:' .. w, 'kv', string.format('%d', derived))
    redis.call('PUBLISH', p .. 'changes', w)
  end
  totals[#totals + 1] = w .. ',' .. string.format('%d', stored) .. ',' .. string.format('%d', derived)
end
return totals
"""

# ARGV: prefix, then session, state JSON pairs
_RESTORE = _SESSION_LIB + """
local written = {}
for i = 2, #ARGV, 2 do
  local sid = ARGV[i]
  local old, new = stored(sid), cjson.decode(ARGV[i + 1])
  if not old or (old[4] < new[4] and redis.call('EXISTS', p .. 'round:' .. sid) == 0) then
    put(sid, old, ARGV[i + 1])
    written[#written + 1] = sid
  end
end
return written
"""

# ARGV: prefix, session, key, entry JSON, most entries per key, most entries per session,
# last round whose entries stay
_INDEX = _SESSION_LIB + """
local sid, key, per_key, per_session = ARGV[2], ARGV[3], tonumber(ARGV[5]), tonumber(ARGV[6])
local kept_to = tonumber(ARGV[7])
if redis.call('HEXISTS', p .. 'sessions', sid) == 0 then return 0 end
local new = cjson.decode(ARGV[4])
local mine = {}
for _, pair in ipairs(filed(sid)) do  -- a branch the new entry left is dropped
  if pair[2] > kept_to then
    local round = pair[2]
    filter(pair[1], function(e) return not (e[1] == sid and e[6] == round) end)
  else
    mine[#mine + 1] = pair
  end
end
local done = {}
for _, pair in ipairs(mine) do  -- its earlier entries are its latest no more
  if not done[pair[1]] then
    done[pair[1]] = true
    filter(pair[1], function(e)
      if e[1] == sid then e[7] = 0 end
      return true
    end)
  end
end
while #mine >= per_session do
  local old = table.remove(mine, 1)
  filter(old[1], function(e) return not (e[1] == sid and e[6] == old[2]) end)
end
local text = redis.call('HGET', p .. 'hidx', key)
local entries = text and cjson.decode(text) or {}
while #entries >= per_key do
  local gone = table.remove(entries, 1)
  local theirs = gone[1] == sid and mine or filed(gone[1])
  for i, pair in ipairs(theirs) do
    if pair[1] == key and pair[2] == gone[6] then table.remove(theirs, i) break end
  end
  if gone[1] ~= sid then
    if #theirs > 0 then redis.call('HSET', p .. 'hses', gone[1], cjson.encode(theirs))
    else redis.call('HDEL', p .. 'hses', gone[1]) end
  end
end
entries[#entries + 1] = new
redis.call('HSET', p .. 'hidx', key, cjson.encode(entries))
mine[#mine + 1] = {key, new[6]}
redis.call('HSET', p .. 'hses', sid, cjson.encode(mine))
return 1
"""

_EPOCH = """
redis.call('SET', KEYS[1], ARGV[1], 'NX')
return redis.call('GET', KEYS[1])
"""

# KEYS: q, qp; ARGV: task key, entry JSON, payload, channel, worker
_PUSH = """
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('RPUSH', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[4], ARGV[5])
"""

# KEYS: q, qp, worker hash; ARGV: task key, entry JSON, in-flight entry JSON (or '' to withdraw), channel, worker
_TAKE = """
if redis.call('LREM', KEYS[1], 1, ARGV[2]) == 0 then return false end
local payload = redis.call('HGET', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], 'postp:' .. ARGV[1])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[3], 'infl:' .. ARGV[1], ARGV[3]) end
redis.call('PUBLISH', ARGV[4], ARGV[5])
return payload or ''
"""

# KEYS: worker hash; ARGV: window field, bucket, total, count, channel, worker
_SAMPLES = """
local bucket, total, count = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if cur then
  local b, s, n = string.match(cur, '([^|]+)|([^|]+)|([^|]+)')
  if tonumber(b) == bucket then total = total + tonumber(s); count = count + tonumber(n) end
end
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d|%.17g|%d', bucket, total, count))
redis.call('PUBLISH', ARGV[5], ARGV[6])
"""

# KEYS: worker hash; ARGV: before (model s). A report is ``[size, kv, slack, as_of]``.
_DROP_BATCHES = """
local fields, dropped = redis.call('HGETALL', KEYS[1]), 0
for j = 1, #fields, 2 do
  if string.sub(fields[j], 1, 6) == 'batch:' and cjson.decode(fields[j + 1])[4] < tonumber(ARGV[1]) then
    redis.call('HDEL', KEYS[1], fields[j]); dropped = dropped + 1
  end
end
return dropped
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisStore:
    """``StateStore`` in a Redis server shared by every coordinator replica.

    Args:
        url: ``redis://host:port/db``.
        window_s: length of the TTFT/ITL windows, model seconds.
        prefix: namespace of every key (several clusters may share one server).
        timeout_s: socket timeout; a call that exceeds it raises ``StoreUnavailable``.

    Raises (from every method): StoreUnavailable.
    """

    def __init__(self, url: str, window_s: float = 10.0, prefix: str = "ampd:", timeout_s: float = 1.0) -> None:
        self.url, self.prefix = url, prefix
        self.bucket_s = window_s / BUCKETS
        self._redis = aioredis.Redis.from_url(url, decode_responses=True, socket_timeout=timeout_s,
                                              socket_connect_timeout=timeout_s)
        self._scripts = {name: self._redis.register_script(code) for name, code in (
            ("snapshot", _SNAPSHOT), ("bind", _BIND), ("start", _START), ("put", _PUT), ("renew", _RENEW),
            ("expire", _EXPIRE), ("audit", _AUDIT), ("restore", _RESTORE), ("index", _INDEX), ("epoch", _EPOCH),
            ("push", _PUSH), ("take", _TAKE), ("samples", _SAMPLES), ("drop_batches", _DROP_BATCHES),
            ("release", _RELEASE))}
        self._listeners: list[asyncio.Task] = []
        self._entries: dict[tuple, QueueEntry] = {}

    def _k(self, *parts: object) -> str:
        return self.prefix + ":".join(str(p) for p in parts)

    async def _run(self, coro):
        try:
            return await coro
        except (RedisError, OSError) as err:
            raise StoreUnavailable(f"Redis at {self.url} failed: {err}") from err

    async def _script(self, name: str, keys: list[str], args: list[object]):
        return await self._run(self._scripts[name](keys=keys, args=args))

    async def ping(self) -> None:
        await self._run(self._redis.ping())

    async def register_workers(self, workers: list[WorkerInfo]) -> None:
        if workers:
            mapping = {str(w.spec.worker_id): w.to_json() for w in workers}
            await self._run(self._redis.hset(self._k("workers"), mapping=mapping))
            for w in workers:
                await self._run(self._redis.hdel(self._k("w", w.spec.worker_id), "dead"))

    async def workers(self) -> list[WorkerInfo]:
        entries = await self._run(self._redis.hgetall(self._k("workers")))
        return sorted((WorkerInfo.from_json(v) for v in entries.values()), key=lambda w: w.spec.worker_id)

    async def snapshot(self, worker_ids: list[int], now_s: float) -> list[WorkerState]:
        oldest = math.floor(now_s / self.bucket_s) - BUCKETS
        rows = json.loads(await self._script("snapshot", [], [self.prefix, oldest, *worker_ids]))
        return [self._state(wid, row) for wid, row in zip(worker_ids, rows)]

    def _state(self, worker_id: int, row: list) -> WorkerState:
        entries, dead, kv, ttft_sum, ttft_count, itl_sum, itl_count, postponed, inflight, batches = row
        postponed = _pairs(postponed) if postponed else {}
        batches = {replica: BatchReport.from_list(report) for replica, report in _pairs(batches).items()}
        queue = [self._entry(e, int(postponed.get(f"{e[0]}#{e[1]}", 0))) for e in entries]
        return WorkerState(worker_id, not dead, queue, [self._entry(e) for e in inflight],
                           ttft_sum / ttft_count if ttft_count else None, itl_sum / itl_count if itl_count else None,
                           kv, batches)

    def _entry(self, values: list, postponements: int = 0) -> QueueEntry:
        """A decoded entry, reused from earlier snapshots: a waiting task's entry
        does not change, and building it again dominated the routing time."""
        key = (values[0], values[1], values[6], values[9], postponements)
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= ENTRY_CACHE_SIZE:
                self._entries.clear()
            entry = self._entries[key] = QueueEntry.from_list(values, postponements)
        return entry

    async def set_alive(self, worker_id: int, alive: bool) -> None:
        key = self._k("w", worker_id)
        await self._write(worker_id, lambda pipe: pipe.hdel(key, "dead") if alive else pipe.hset(key, "dead", 1))

    async def sessions(self) -> dict[str, SessionState]:
        """Reads the whole ``sessions`` hash: O(sessions)."""
        entries = await self._run(self._redis.hgetall(self._k("sessions")))
        return {sid: SessionState.from_json(text) for sid, text in entries.items()}

    async def bind_session(self, session_id: str, state: SessionState, capacity_tokens: int, lease: str,
                           lease_ttl_s: float) -> str:
        return await self._script("bind", [], [self.prefix, session_id, state.to_json(), capacity_tokens, lease,
                                               _ms(lease_ttl_s), _replica(lease)])

    async def start_round(self, session_id: str, scope: str, lease: str, lease_ttl_s: float, need_tokens: int,
                          now_s: float) -> RoundStart:
        reply = await self._script("start", [], [self.prefix, session_id, scope, lease, _ms(lease_ttl_s),
                                                 need_tokens, repr(now_s), _replica(lease)])
        if reply[0] != STARTED:
            return RoundStart(reply[0])
        return RoundStart(STARTED, SessionState.from_json(reply[1]), SessionState.from_json(reply[2]))

    async def move_session(self, session_id: str, lease: str, state: SessionState, capacity_tokens: int,
                           lease_ttl_s: float) -> str:
        return await self._script("put", [], [self.prefix, session_id, lease, state.to_json(), capacity_tokens,
                                              _ms(lease_ttl_s), state.num_rounds])

    async def close_round(self, session_id: str, lease: str, state: SessionState | None, num_rounds: int) -> str:
        return await self._script("put", [], [self.prefix, session_id, lease, state.to_json() if state else "", "",
                                              "0", num_rounds])

    async def renew_leases(self, leases: dict[str, str], lease_ttl_s: float) -> list[str]:
        if not leases:
            return []
        pairs = [part for item in leases.items() for part in item]
        return await self._script("renew", [], [self.prefix, _ms(lease_ttl_s), *pairs])

    async def expire_sessions(self, idle_before_s: float) -> list[str]:
        """One script over the whole ``sessions`` hash: O(sessions) per call."""
        return await self._script("expire", [], [self.prefix, repr(idle_before_s)])

    async def audit_kv(self, worker_ids: list[int]) -> dict[int, tuple[int, int]]:
        """One script over the whole ``sessions`` hash: O(sessions) per call."""
        totals = {}
        for row in await self._script("audit", [], [self.prefix, *worker_ids]):
            worker_id, stored, derived = (int(v) for v in row.split(","))
            totals[worker_id] = (stored, derived)
        return totals

    async def restore_sessions(self, states: dict[str, SessionState]) -> list[str]:
        if not states:
            return []
        pairs = [part for sid, state in states.items() for part in (sid, state.to_json())]
        return await self._script("restore", [], [self.prefix, *pairs])

    async def index_history(self, session_id: str, key: str, entry: HistoryEntry, max_entries_per_key: int,
                            max_entries_per_session: int, kept_to_round: int) -> bool:
        return bool(await self._script("index", [], [self.prefix, session_id, key, json.dumps(entry.to_list()),
                                                     max_entries_per_key, max_entries_per_session,
                                                     kept_to_round]))

    async def history_entries(self, keys: list[str]) -> list[list[HistoryEntry]]:
        if not keys:
            return []
        texts = await self._run(self._redis.hmget(self._k("hidx"), keys))
        return [[HistoryEntry.from_list(e) for e in json.loads(text)] if text else [] for text in texts]

    async def epoch(self) -> str:
        return await self._script("epoch", [self._k("epoch")], [uuid.uuid4().hex])

    async def subscribe_owners(self, handler: Callable[[str, str], None]) -> None:
        """Call ``handler(session id, replica id)`` whenever a replica starts a round
        of a session (so the others forget what they knew of it)."""
        def on_message(data: str) -> None:
            session_id, replica = json.loads(data)
            handler(session_id, replica)
        await self._listen_to(self._k("owners"), on_message)

    async def push(self, worker_id: int, entry: QueueEntry, payload: str) -> None:
        keys = [self._k("q", worker_id), self._k("qp", worker_id)]
        await self._script("push", keys, [entry.key, entry.to_json(), payload, *self._feed(worker_id)])

    async def set_postponements(self, worker_id: int, counts: dict[str, int]) -> None:
        if counts:
            mapping = {f"postp:{key}": n for key, n in counts.items()}
            await self._write(worker_id, lambda pipe: pipe.hset(self._k("w", worker_id), mapping=mapping))

    def _queue_keys(self, worker_id: int) -> list[str]:
        return [self._k(kind, worker_id) for kind in ("q", "qp", "w")]

    async def take(self, worker_id: int, entry: QueueEntry, dispatch_s: float) -> tuple[QueueEntry, str] | None:
        waiting = QueueEntry(QueuedTask(entry.queued.task, entry.queued.enqueue_s, entry.queued.cost_s),
                             entry.owner)
        running = QueueEntry(entry.queued, entry.owner, dispatch_s)
        payload = await self._script("take", self._queue_keys(worker_id),
                                     [entry.key, waiting.to_json(), running.to_json(), *self._feed(worker_id)])
        return None if payload is None else (running, payload)

    async def withdraw(self, worker_id: int, entry: QueueEntry) -> bool:
        args = [entry.key, entry.to_json(), "", *self._feed(worker_id)]
        return await self._script("take", self._queue_keys(worker_id), args) is not None

    async def add_inflight(self, worker_id: int, entry: QueueEntry) -> None:
        await self._write(worker_id, lambda pipe: pipe.hset(self._k("w", worker_id), f"infl:{entry.key}",
                                                            entry.to_json()))

    async def remove_inflight(self, worker_id: int, key: str) -> None:
        await self._write(worker_id, lambda pipe: pipe.hdel(self._k("w", worker_id), f"infl:{key}"))

    async def add_samples(self, worker_id: int, kind: str, now_s: float, total_s: float, count: int) -> None:
        bucket = math.floor(now_s / self.bucket_s)
        await self._script("samples", [self._k("w", worker_id)],
                           [f"win:{kind}:{bucket % (BUCKETS + 1)}", bucket, total_s, count, *self._feed(worker_id)])

    async def report_batch(self, worker_id: int, replica_id: str, report: BatchReport) -> None:
        # Not announced on the change feed: a replica streaming from the worker flushes its ITL
        # samples in the same period, which is announced, and the mirrors re-read everything every
        # ``StateMirror.refresh_s`` anyway; announcing it too doubled the feed's re-reads.
        await self._run(self._redis.hset(self._k("w", worker_id), f"batch:{replica_id}",
                                         json.dumps(report.to_list())))

    async def drop_batch_reports(self, worker_id: int, before_s: float) -> int:
        return await self._script("drop_batches", [self._k("w", worker_id)], [repr(before_s)])

    async def acquire_lease(self, worker_id: int, owner: str, ttl_s: float) -> bool:
        return bool(await self._run(self._redis.set(self._k("lease", worker_id), owner, nx=True, px=_ms(ttl_s))))

    async def release_lease(self, worker_id: int, owner: str) -> None:
        await self._script("release", [self._k("lease", worker_id)], [owner])

    async def publish(self, owner: str, message: dict) -> None:
        await self._run(self._redis.publish(self._k("results", owner), json.dumps(message)))

    async def subscribe(self, owner: str, handler: ResultHandler) -> None:
        await self._listen_to(self._k("results", owner), lambda data: handler(json.loads(data)))

    def _feed(self, worker_id: int) -> tuple[str, str]:
        """The change feed's channel and a worker id: the ARGV a script announces with."""
        return self._k("changes"), str(worker_id)

    async def _write(self, worker_id: int, command: Callable) -> None:
        """One write to a worker's state and its announcement, in one round trip."""
        async with self._redis.pipeline(transaction=True) as pipe:
            command(pipe)
            pipe.publish(*self._feed(worker_id))
            await self._run(pipe.execute())

    async def subscribe_changes(self, handler: Callable[[list[int] | None], None]) -> None:
        """Call ``handler`` with the ids of workers whose state changed (any
        replica's doing), or with None when changes may have been missed (the
        channel broke): the feed a ``StateMirror`` keeps itself current with."""
        def on_message(data: str) -> None:
            handler([int(w) for w in data.split(",") if w])
        await self._listen_to(self._k("changes"), on_message, lambda: handler(None))

    async def _listen_to(self, channel: str, on_message: Callable[[str], object],
                         on_gap: Callable[[], object] = lambda: None) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        await self._run(pubsub.subscribe(channel))
        self._listeners.append(asyncio.create_task(self._listen(pubsub, channel, on_message, on_gap)))

    async def _listen(self, pubsub, channel: str, on_message: Callable[[str], object],
                      on_gap: Callable[[], object]) -> None:
        """Deliver messages; through an outage, keep resubscribing (a result missed
        meanwhile makes its waiter time out and recompute locally; a missed change
        makes ``on_gap`` tell the mirror to refresh everything)."""
        while True:
            try:
                message = await pubsub.get_message(timeout=1.0)
                if message is not None:
                    result = on_message(message["data"])
                    if inspect.isawaitable(result):
                        await result
            except (RedisError, OSError) as err:
                log.warning("channel %s: %s; resubscribing", channel, err)
                on_gap()
                await asyncio.sleep(0.5)
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.subscribe(channel)

    async def close(self) -> None:
        for task in self._listeners:
            task.cancel()
        await asyncio.gather(*self._listeners, return_exceptions=True)
        self._listeners.clear()
        await self._redis.aclose()


def _ms(seconds: float) -> int:
    """Wall milliseconds for a Redis expiry (at least 1)."""
    return max(1, int(seconds * 1000))


def _replica(lease: str) -> str:
    """The replica a round lease names (``<replica>#<n>``)."""
    return lease.rpartition("#")[0]


def _pairs(flat: list[str]) -> dict[str, str]:
    """A Redis HGETALL reply from a script (flat key, value list) as a dict."""
    return dict(zip(flat[::2], flat[1::2]))
