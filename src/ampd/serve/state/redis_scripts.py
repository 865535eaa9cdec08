"""The Redis layout of the shared state and the Lua scripts that change it
(``RedisStore`` calls them by name from ``SCRIPTS``).

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
| ``hidx`` | hash | prompt index (``ampd.serve.state.prompt_index``): prefix hash -> JSON list of ``HistoryEntry`` lists, oldest first |
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

BUCKETS = 10

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

SCRIPTS = {"snapshot": _SNAPSHOT, "bind": _BIND, "start": _START, "put": _PUT, "renew": _RENEW, "expire": _EXPIRE,
           "audit": _AUDIT, "restore": _RESTORE, "index": _INDEX, "epoch": _EPOCH, "push": _PUSH, "take": _TAKE,
           "samples": _SAMPLES, "drop_batches": _DROP_BATCHES, "release": _RELEASE}
