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

-- walk(prefix, blob, n_hash, cands) -> overlap[cand_index] = leading blocks held.
-- blob: the request's block hashes, 8 raw bytes each (big-endian), in one argument.
-- cands: list of {byte_index, mask, cand_index}. Slots are grouped by the bitmap byte they live
-- in, so each block costs one string.byte + bit.band per byte that still has a matching slot
-- (8 slots a byte); a slot's overlap is written once, when it stops matching.
local function walk(prefix, blob, n_hash, cands)
  local overlap, idxs, masks, owner = {}, {}, {}, {}
  for _, c in ipairs(cands) do
    local bi = c[1]
    if masks[bi] == nil then
      masks[bi] = 0
      idxs[#idxs + 1] = bi
      owner[bi] = {}
    end
    masks[bi] = bit.bor(masks[bi], c[2])
    owner[bi][c[2]] = c[3]
  end
  local n_active = #idxs
  local i, chunk, prev = 0, 16, nil
  while i < n_hash and n_active > 0 do
    local hi = math.min(i + chunk, n_hash)
    local keys = {}
    for j = i + 1, hi do keys[#keys + 1] = prefix .. string.sub(blob, 8 * j - 7, 8 * j) end
    local vals = redis.call('MGET', unpack(keys))
    for j = 1, #vals do
      local v = vals[j]
      local pos = i + j - 1
      local k = 1
      if v and v == prev then k = n_active + 1 end  -- same holders as the block before
      prev = v
      while k <= n_active do
        local bi = idxs[k]
        local m = masks[bi]
        local nm = 0
        if v then nm = bit.band(string.byte(v, bi) or 0, m) end
        if nm ~= m then
          local dropped = bit.band(m, bit.bnot(nm))
          for b, ci in pairs(owner[bi]) do
            if bit.band(dropped, b) ~= 0 then overlap[ci] = pos end
          end
          masks[bi] = nm
          if nm == 0 then
            idxs[k] = idxs[n_active]
            idxs[n_active] = nil
            n_active = n_active - 1
            k = k - 1
          end
        end
        k = k + 1
      end
      if n_active == 0 then break end
    end
    i = hi
    chunk = chunk * 4
  end
  for k = 1, n_active do
    local bi = idxs[k]
    for b, ci in pairs(owner[bi]) do
      if bit.band(masks[bi], b) ~= 0 then overlap[ci] = n_hash end
    end
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

# ARGV: ns, model, worker, event_id, stream_seq, then ops: 'S' engine_blob fleet_blob |
#       'R' engine_blob fleet_blob | 'C' (blobs: 8 raw bytes a hash, in the same order)
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
    local eb, fb = ARGV[i + 1], ARGV[i + 2]
    local fields = {}
    for k = 1, #fb / 8 do
      local e, f = string.sub(eb, 8 * k - 7, 8 * k), string.sub(fb, 8 * k - 7, 8 * k)
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
    i = i + 3
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

# ARGV: ns, model, hash_blob -> flat {worker, blocks, worker, blocks, ...}
MATCH = (
    _COMMON
    + r"""
local ns, model, blob = ARGV[1], ARGV[2], ARGV[3]
local n_hash = #blob / 8
local slots = redis.call('HGETALL', ns .. ':slot:' .. model)
local cands, names = {}, {}
for k = 1, #slots, 2 do
  local t = slot_test(tonumber(slots[k + 1]))
  cands[#cands + 1] = {t[1], t[2], #cands + 1}
  names[#names + 1] = slots[k]
end
local overlap = walk(ns .. ':b:' .. model .. ':', blob, n_hash, cands)
local out = {}
for idx, blocks in pairs(overlap) do
  if blocks > 0 then
    out[#out + 1] = names[idx]
    out[#out + 1] = blocks
  end
end
return out
"""
)

# One atomic routing step: expire old reservations, match, score every candidate, pick, reserve.
# ARGV: ns, model, request_id, now_ms, ttl_ms, prefill_weight, temperature, rand01, new_blocks,
#       candidates ("worker\tprefill_blocks\tdecode_blocks\thint_overlap\n" each), hash_blob.
# Returns {winner_index, "overlap,..", "cost,..", "load,.."} (one string each: cheap to return).
ROUTE = (
    _COMMON
    + r"""
local ns, model, rid = ARGV[1], ARGV[2], ARGV[3]
local now, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local pw, temp, rnd = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local new_blocks, blob = tonumber(ARGV[9]), ARGV[11]
local n_hash = #blob / 8
expire_reservations(ns, now)
local workers, rep_p, rep_d, hint, fields = {}, {}, {}, {}, {}
local pat = "([^\t\n]+)\t([^\t\n]+)\t([^\t\n]+)\t([^\t\n]+)\n"
for w, p, d, h in string.gmatch(ARGV[10], pat) do
  workers[#workers + 1] = w
  rep_p[#workers] = tonumber(p)
  rep_d[#workers] = tonumber(d)
  hint[#workers] = tonumber(h)
  fields[#fields + 1] = w .. ':p'
  fields[#fields + 1] = w .. ':d'
end
local n_cand = #workers
local slots = redis.call('HMGET', ns .. ':slot:' .. model, unpack(workers))
local cands = {}
for c = 1, n_cand do
  if slots[c] then
    local t = slot_test(tonumber(slots[c]))
    cands[#cands + 1] = {t[1], t[2], c}
  end
end
local overlap = walk(ns .. ':b:' .. model .. ':', blob, n_hash, cands)
local res = redis.call('HMGET', ns .. ':load:' .. model, unpack(fields))
local costs, loads, best = {}, {}, nil
for c = 1, n_cand do
  local ov = math.max(overlap[c] or 0, hint[c])
  overlap[c] = ov
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
local ov = {}
for c = 1, n_cand do ov[c] = overlap[c] or 0 end
return {winner, table.concat(ov, ','), table.concat(costs, ','), table.concat(loads, ',')}
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
