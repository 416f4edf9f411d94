"""Lua scripts of the Redis prefix index. Each runs atomically and is bounded in work.

Keys are derived inside the scripts from the namespace argument (single-node Redis or Sentinel;
not Redis Cluster). Numbers cross the boundary as strings where Lua would truncate them.
"""

# Shared: find or allocate a worker's slot; walk a chain of block hashes over slot bitmaps.
_COMMON = r"""
local function slot_of(ns, model, worker, create)
  local s = redis.call('HGET', ns .. ':slot:' .. model, worker)
  if s then return tonumber(s) end
  if not create then return nil end
  local free = redis.call('LPOP', ns .. ':slotfree:' .. model)
  if free then s = tonumber(free) else
    s = redis.call('INCR', ns .. ':slotnext:' .. model) - 1 end
  redis.call('HSET', ns .. ':slot:' .. model, worker, s)
  return s
end

-- walk(prefix, first_argv, n_hash, cands) -> overlap[cand_index] = leading blocks held.
-- cands: list of {byte_index, mask, cand_index}; only slots still matching are tested.
local function walk(prefix, first, n_hash, cands)
  local overlap = {}
  local active = cands
  local i = 0
  local chunk = 16
  while i < n_hash and #active > 0 do
    local hi = math.min(i + chunk, n_hash)
    local keys = {}
    for j = i + 1, hi do keys[#keys + 1] = prefix .. ARGV[first + j - 1] end
    local vals = redis.call('MGET', unpack(keys))
    for j = 1, #vals do
      local v = vals[j]
      if not v then active = {} break end
      local nxt = {}
      for _, c in ipairs(active) do
        local b = string.byte(v, c[1])
        if b and bit.band(b, c[2]) ~= 0 then
          nxt[#nxt + 1] = c
          overlap[c[3]] = i + j
        end
      end
      active = nxt
      if #active == 0 then break end
    end
    i = hi
    chunk = chunk * 4
  end
  return overlap
end

local function slot_test(s)
  return {math.floor(s / 8) + 1, 2 ^ (7 - (s % 8))}
end

local function release(ns, rid)
  local r = redis.call('HMGET', ns .. ':r:' .. rid, 'w', 'm', 'p', 'd')
  if r[1] then
    local load = ns .. ':load:' .. r[2]
    if tonumber(r[3]) ~= 0 then redis.call('HINCRBY', load, r[1] .. ':p', -tonumber(r[3])) end
    if tonumber(r[4]) ~= 0 then redis.call('HINCRBY', load, r[1] .. ':d', -tonumber(r[4])) end
    redis.call('DEL', ns .. ':r:' .. rid)
  end
  redis.call('ZREM', ns .. ':rexp', rid)
  return r[1] and 1 or 0
end

local function expire_reservations(ns, now)
  local old = redis.call('ZRANGEBYSCORE', ns .. ':rexp', '-inf', now, 'LIMIT', 0, 64)
  for _, rid in ipairs(old) do release(ns, rid) end
end
"""

# ARGV: ns, model, worker, event_id, stream_seq, then ops: 'S' n e1 f1 .. en fn | 'R' n .. | 'C'
APPLY = (
    _COMMON
    + r"""
local ns, model, worker = ARGV[1], ARGV[2], ARGV[3]
local event_id, seq = tonumber(ARGV[4]), tonumber(ARGV[5])
local pos = ns .. ':pos'
if seq > 0 then
  local cur = tonumber(redis.call('HGET', pos, 'seq') or '0')
  if cur >= seq then return {0, 0} end
end
if worker == '' then  -- a message that carried nothing to apply: only the position moves
  if seq > 0 then redis.call('HSET', pos, 'seq', seq) end
  return {1, 0}
end
local slot = slot_of(ns, model, worker, true)
local prefix = ns .. ':b:' .. model .. ':'
local map = ns .. ':map:' .. model .. ':' .. worker
local evid = ns .. ':evid:' .. model
local last = tonumber(redis.call('HGET', evid, worker) or '0')
local gap = 0
if last > 0 and event_id ~= last + 1 then gap = 1 end

local function clear_bit(f)
  local key = prefix .. f
  redis.call('SETBIT', key, slot, 0)
  if redis.call('BITCOUNT', key) == 0 then redis.call('DEL', key) end
end

local i = 6
while i <= #ARGV do
  local op = ARGV[i]
  if op == 'C' then
    local all = redis.call('HVALS', map)
    for _, f in ipairs(all) do clear_bit(f) end
    redis.call('DEL', map)
    i = i + 1
  else
    local n = tonumber(ARGV[i + 1])
    local fields = {}
    for k = 0, n - 1 do
      local e, f = ARGV[i + 2 + 2 * k], ARGV[i + 3 + 2 * k]
      if op == 'S' then
        redis.call('SETBIT', prefix .. f, slot, 1)
        fields[#fields + 1] = e
        fields[#fields + 1] = f
      else
        clear_bit(f)
        fields[#fields + 1] = e
      end
      if #fields >= 4000 then
        if op == 'S' then redis.call('HSET', map, unpack(fields))
        else redis.call('HDEL', map, unpack(fields)) end
        fields = {}
      end
    end
    if #fields > 0 then
      if op == 'S' then redis.call('HSET', map, unpack(fields))
      else redis.call('HDEL', map, unpack(fields)) end
    end
    i = i + 2 + 2 * n
  end
end
if event_id > last then redis.call('HSET', evid, worker, event_id) end
if seq > 0 then redis.call('HSET', pos, 'seq', seq) end
return {1, gap}
"""
)

# ARGV: ns, model, worker, stream_seq (0: not from the stream)
DROP_WORKER = (
    _COMMON
    + r"""
local ns, model, worker, seq = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local slot = slot_of(ns, model, worker, false)
redis.call('HDEL', ns .. ':evid:' .. model, worker)
if slot == nil then return 0 end
local prefix = ns .. ':b:' .. model .. ':'
local map = ns .. ':map:' .. model .. ':' .. worker
local all = redis.call('HVALS', map)
for _, f in ipairs(all) do
  local key = prefix .. f
  redis.call('SETBIT', key, slot, 0)
  if redis.call('BITCOUNT', key) == 0 then redis.call('DEL', key) end
end
redis.call('DEL', map)
redis.call('HDEL', ns .. ':slot:' .. model, worker)
redis.call('RPUSH', ns .. ':slotfree:' .. model, slot)
if seq > 0 then
  local cur = tonumber(redis.call('HGET', ns .. ':pos', 'seq') or '0')
  if seq > cur then redis.call('HSET', ns .. ':pos', 'seq', seq) end
end
return #all
"""
)

# ARGV: ns, model, n_hash, hashes... -> flat {worker, blocks, worker, blocks, ...}
MATCH = (
    _COMMON
    + r"""
local ns, model, n_hash = ARGV[1], ARGV[2], tonumber(ARGV[3])
local slots = redis.call('HGETALL', ns .. ':slot:' .. model)
local cands, names = {}, {}
for k = 1, #slots, 2 do
  local t = slot_test(tonumber(slots[k + 1]))
  cands[#cands + 1] = {t[1], t[2], #cands + 1}
  names[#names + 1] = slots[k]
end
local overlap = walk(ns .. ':b:' .. model .. ':', 4, n_hash, cands)
local out = {}
for idx, blocks in pairs(overlap) do
  out[#out + 1] = names[idx]
  out[#out + 1] = blocks
end
return out
"""
)

# One atomic routing step: expire old reservations, match, score every candidate, pick, reserve.
# ARGV: ns, model, request_id, now_ms, ttl_ms, prefill_weight, temperature, rand01, new_blocks,
#       n_cand, n_hash, then per candidate (worker, reported_prefill_blocks,
#       reported_decode_blocks), then the request's block hashes.
# Returns {winner_index, overlap_1..n, "cost_1".."cost_n", "load_1".."load_n"}.
ROUTE = (
    _COMMON
    + r"""
local ns, model, rid = ARGV[1], ARGV[2], ARGV[3]
local now, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local pw, temp, rnd = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local new_blocks, n_cand, n_hash = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
expire_reservations(ns, now)
local workers, rep_p, rep_d, fields = {}, {}, {}, {}
for c = 1, n_cand do
  local base = 12 + (c - 1) * 3
  workers[c] = ARGV[base]
  rep_p[c] = tonumber(ARGV[base + 1])
  rep_d[c] = tonumber(ARGV[base + 2])
  fields[#fields + 1] = ARGV[base] .. ':p'
  fields[#fields + 1] = ARGV[base] .. ':d'
end
local slots = redis.call('HMGET', ns .. ':slot:' .. model, unpack(workers))
local cands = {}
for c = 1, n_cand do
  if slots[c] then
    local t = slot_test(tonumber(slots[c]))
    cands[#cands + 1] = {t[1], t[2], c}
  end
end
local overlap = walk(ns .. ':b:' .. model .. ':', 12 + n_cand * 3, n_hash, cands)
local res = redis.call('HMGET', ns .. ':load:' .. model, unpack(fields))
local costs, loads, best = {}, {}, nil
for c = 1, n_cand do
  local ov = overlap[c] or 0
  local ap = math.max(tonumber(res[2 * c - 1] or '0'), rep_p[c])
  local ad = math.max(tonumber(res[2 * c] or '0'), rep_d[c])
  local cost = pw * math.max(ap + new_blocks - ov, 0) + ad + new_blocks
  costs[c] = cost
  loads[c] = ap + ad
  if best == nil or cost < best then best = cost end
end
local winner
if temp > 0 then
  local total, weights = 0, {}
  for c = 1, n_cand do
    weights[c] = math.exp(-(costs[c] - best) / temp)
    total = total + weights[c]
  end
  local acc, target = 0, rnd * total
  winner = n_cand
  for c = 1, n_cand do
    acc = acc + weights[c]
    if target < acc then winner = c break end
  end
else
  local ties = {}
  for c = 1, n_cand do if costs[c] == best then ties[#ties + 1] = c end end
  winner = ties[math.min(#ties, math.floor(rnd * #ties) + 1)]
end
local w = workers[winner]
local p = math.max(new_blocks - (overlap[winner] or 0), 0)
local d = new_blocks
local load = ns .. ':load:' .. model
if rid ~= '' then
  release(ns, rid)
  redis.call('HINCRBY', load, w .. ':p', p)
  redis.call('HINCRBY', load, w .. ':d', d)
  redis.call('HSET', ns .. ':r:' .. rid, 'w', w, 'm', model, 'p', p, 'd', d)
  redis.call('PEXPIRE', ns .. ':r:' .. rid, ttl)
  redis.call('ZADD', ns .. ':rexp', now + ttl, rid)
end
local out = {winner}
for c = 1, n_cand do out[#out + 1] = overlap[c] or 0 end
for c = 1, n_cand do out[#out + 1] = tostring(costs[c]) end
for c = 1, n_cand do out[#out + 1] = tostring(loads[c]) end
return out
"""
)

# ARGV: ns, request_id, part ('all' | 'prefill')
RELEASE = (
    _COMMON
    + r"""
local ns, rid, part = ARGV[1], ARGV[2], ARGV[3]
if part == 'prefill' then
  local key = ns .. ':r:' .. rid
  local r = redis.call('HMGET', key, 'w', 'm', 'p')
  if r[1] and tonumber(r[3]) ~= 0 then
    redis.call('HINCRBY', ns .. ':load:' .. r[2], r[1] .. ':p', -tonumber(r[3]))
    redis.call('HSET', key, 'p', 0)
  end
  return r[1] and 1 or 0
end
return release(ns, rid)
"""
)
