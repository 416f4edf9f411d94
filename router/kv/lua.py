"""Lua scripts of the Redis prefix index (layout in ``keys``). Each runs atomically and is bounded.

Keys are derived inside the scripts from the ``ns`` argument (``KvKeys.base``; single-node Redis
or Sentinel, not Redis Cluster). Block hashes cross the boundary as one binary argument, 8 raw
big-endian bytes each, sliced in Lua (a slice is a hash field as is: nothing else to build).
Numbers cross as strings where Lua would truncate them; ROUTE takes and returns msgpack
(``cmsgpack``) so its per-candidate columns cost no Lua string parsing.

Bounds: ``APPLY_MANY`` carries as many block events as the caller packs into one call (the
indexer caps a call at ``redis_index.MAX_BLOCKS_PER_CALL``; 3-4 µs of Redis time per block event
here). ``MATCH`` / ``ROUTE`` bisect the chains of prefix-closed workers (about log2(n) block reads
per distinct overlap) and walk the others' block by block, in growing chunks that stop when none
of them still matches. Lua in Redis costs 0.1-0.4 µs per C call or table operation here, so the
per-candidate loops (64 workers) are written to do as little as they can.
"""

# Shared helpers. CHUNK bounds the arguments of one command built with unpack() (Lua's C stack
# takes ~8000 values).
_COMMON = r"""
local CHUNK = 1000
local sub, byte, char = string.sub, string.byte, string.char

-- The slot hash again as one msgpack map (worker -> slot) under slotmap: ROUTE decodes it in C
-- instead of building a Lua table from HGETALL (a few µs instead of ~50 for 64 workers).
local function save_slotmap(ns, model)
  local all = redis.call('HGETALL', ns .. ':slot:' .. model)
  local t = {}
  for k = 1, #all, 2 do t[all[k]] = tonumber(all[k + 1]) end
  redis.call('SET', ns .. ':slotmap:' .. model, cmsgpack.pack(t))
end

local function slot_of(ns, model, worker, create)
  local s = redis.call('HGET', ns .. ':slot:' .. model, worker)
  if s then return tonumber(s) end
  if not create then return nil end
  local free = redis.call('LPOP', ns .. ':slotfree:' .. model)
  if free then s = tonumber(free) else
    s = redis.call('INCR', ns .. ':slotnext:' .. model) - 1 end
  redis.call('HSET', ns .. ':slot:' .. model, worker, s)
  save_slotmap(ns, model)
  return s
end

-- byte index (1-based) and mask of a slot's bit in a holder bitmap (MSB first, like SETBIT)
local function slot_bit(s)
  return math.floor(s / 8) + 1, 2 ^ (7 - s % 8)
end

-- v with the bit (bi, m) set (on) or cleared; false if unchanged. Cleared bitmaps lose their
-- trailing zero bytes ('' = nobody holds the block).
local function flip(v, bi, m, on)
  local old = byte(v, bi) or 0
  if (bit.band(old, m) ~= 0) == on then return false end
  local nb = on and old + m or old - m
  local nv
  if #v < bi then nv = v .. string.rep('\0', bi - 1 - #v) .. char(nb)
  else nv = sub(v, 1, bi - 1) .. char(nb) .. sub(v, bi + 1) end
  if not on then nv = string.match(nv, '^(.-)%z*$') end
  return nv
end

local function hset_chunks(key, kv)
  for lo = 1, #kv, 2 * CHUNK do
    redis.call('HSET', key, unpack(kv, lo, math.min(lo + 2 * CHUNK - 1, #kv)))
  end
end

local function hdel_chunks(key, fields)
  for lo = 1, #fields, CHUNK do
    redis.call('HDEL', key, unpack(fields, lo, math.min(lo + CHUNK - 1, #fields)))
  end
end

-- Set (on) or clear one slot's bit in the holder bitmaps of `fields` (block hashes) in hash
-- `bkey`: one HMGET and one HSET (+ HDEL) per CHUNK blocks. Holder sets repeat along a chain, so
-- new values are memoised per old value.
local function update_bits(bkey, fields, slot, on)
  local bi, m = slot_bit(slot)
  local memo, kv, gone, nk, ng = {}, {}, {}, 0, 0
  local fresh = on and string.rep('\0', bi - 1) .. char(m)
  local n = #fields
  for lo = 1, n, CHUNK do
    local off = lo - 1
    local vals = redis.call('HMGET', bkey, unpack(fields, lo, math.min(off + CHUNK, n)))
    for j = 1, #vals do
      local v = vals[j]
      local nv = fresh
      if v then
        nv = memo[v]
        if nv == nil then nv = flip(v, bi, m, on); memo[v] = nv end
      end
      if nv then
        if nv == '' then ng = ng + 1; gone[ng] = fields[off + j]
        else nk = nk + 2; kv[nk - 1] = fields[off + j]; kv[nk] = nv end
      end
    end
  end
  hset_chunks(bkey, kv)
  hdel_chunks(bkey, gone)
end

-- The 8-byte slices of a blob.
local function slices(blob)
  local out = {}
  for k = 1, #blob / 8 do out[k] = sub(blob, 8 * k - 7, 8 * k) end
  return out
end

-- The fleet hash in a map entry (engine hash e, value v; layout in ``keys``): v is the parent
-- ('' root, '?' unknown) when the fleet hash is e, else the fleet hash and then the parent
-- (8 bytes) or 'r' (root) or '?' (unknown).
local function fleet_of(e, v)
  if #v >= 9 then return sub(v, 1, 8) end
  return e
end

-- Clear every block of a worker's map from the bitmaps and delete the map; returns #blocks.
local function clear_worker(ns, model, worker, slot)
  local map = ns .. ':map:' .. model .. ':' .. worker
  local all = redis.call('HGETALL', map)
  local fleet = {}
  for k = 1, #all, 2 do fleet[(k + 1) / 2] = fleet_of(all[k], all[k + 1]) end
  update_bits(ns .. ':blk:' .. model, fleet, slot, false)
  redis.call('DEL', map)
  return #fleet
end

-- Matching. A set of candidates is a table bitmap byte index -> mask of their slots' bits (as
-- in a holder bitmap), so testing a block against a set costs one bit.band per byte (8 slots
-- each), not one test per candidate; cand[slot] = the candidate's index.
local MASK = {128, 64, 32, 16, 8, 4, 2, 1}

local function assign(overlap, cand, bi, mask, value)  -- comparisons only: no C calls
  local s = (bi - 1) * 8
  if mask >= 128 then overlap[cand[s]] = value; mask = mask - 128 end
  if mask >= 64 then overlap[cand[s + 1]] = value; mask = mask - 64 end
  if mask >= 32 then overlap[cand[s + 2]] = value; mask = mask - 32 end
  if mask >= 16 then overlap[cand[s + 3]] = value; mask = mask - 16 end
  if mask >= 8 then overlap[cand[s + 4]] = value; mask = mask - 8 end
  if mask >= 4 then overlap[cand[s + 5]] = value; mask = mask - 4 end
  if mask >= 2 then overlap[cand[s + 6]] = value; mask = mask - 2 end
  if mask >= 1 then overlap[cand[s + 7]] = value end
end

-- walk(bkey, blob, n_hash, set, cand) -> overlap[c] = leading blocks held, block by block: a
-- block whose holders are those of the block before costs nothing; a candidate's overlap is
-- written once, when it stops matching. Blocks are read in growing chunks (HMGET of raw hash
-- fields), so a prompt nobody holds costs one small read.
local function walk(bkey, blob, n_hash, set, cand)
  local overlap, idxs, masks, n_active = {}, {}, {}, 0
  for bi, m in pairs(set) do
    n_active = n_active + 1
    idxs[n_active] = bi
    masks[bi] = m
  end
  local band = bit.band
  local i, chunk, prev = 0, 32, nil
  while i < n_hash and n_active > 0 do
    local hi = math.min(i + chunk, n_hash)
    local fields = {}
    for j = i + 1, hi do fields[j - i] = sub(blob, 8 * j - 7, 8 * j) end
    local vals = redis.call('HMGET', bkey, unpack(fields))
    for j = 1, #vals do
      local v = vals[j]
      if not (v and v == prev) then  -- same holders as the block before: nothing changes
        prev = v
        local k = 1
        while k <= n_active do
          local bi = idxs[k]
          local m = masks[bi]
          local nm = v and band(byte(v, bi) or 0, m) or 0
          if nm ~= m then
            assign(overlap, cand, bi, m - nm, i + j - 1)
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
    end
    i = hi
    chunk = math.min(chunk * 4, CHUNK * 4)
  end
  for k = 1, n_active do assign(overlap, cand, idxs[k], masks[idxs[k]], n_hash) end
  return overlap
end

-- bisect(bkey, blob, n_hash, set, cand) -> overlap[c], for candidates whose held blocks are
-- prefix-closed (holding block i of a chain means holding blocks 0..i-1, see ``shape``): a read
-- of block `mid` splits the candidates whose overlap lies in [lo, hi] into those holding it
-- (overlap in [mid+1, hi]) and the others ([lo, mid]), so a request costs about log2(n) reads
-- per distinct overlap among the candidates instead of n. Sets are flat {byte, mask, ...} arrays
-- here; a read that does not split a set reuses it.
local function bisect(bkey, blob, n_hash, set, cand)
  local overlap, ys = {}, {}
  local band, floor = bit.band, math.floor
  local flat = {}
  for bi, mask in pairs(set) do flat[#flat + 1] = bi; flat[#flat + 1] = mask end
  local stack, top = {0, n_hash, flat}, 3
  while top > 0 do
    local lo, hi, cs = stack[top - 2], stack[top - 1], stack[top]
    top = top - 3
    local nb = #cs
    if lo == hi then
      for k = 1, nb, 2 do assign(overlap, cand, cs[k], cs[k + 1], lo) end
    else
      local mid = floor((lo + hi) / 2)
      local v = redis.call('HGET', bkey, sub(blob, 8 * mid + 1, 8 * mid + 8))
      local all_yes, all_no = v and true or false, true
      if v then
        for k = 1, nb, 2 do
          local y = band(byte(v, cs[k]) or 0, cs[k + 1])
          ys[k] = y
          if y ~= 0 then all_no = false end
          if y ~= cs[k + 1] then all_yes = false end
        end
      end
      if all_no then
        stack[top + 1], stack[top + 2], stack[top + 3] = lo, mid, cs
        top = top + 3
      elseif all_yes then
        stack[top + 1], stack[top + 2], stack[top + 3] = mid + 1, hi, cs
        top = top + 3
      else
        local yes, no = {}, {}
        for k = 1, nb, 2 do
          local y, mask = ys[k], cs[k + 1]
          if y ~= 0 then yes[#yes + 1] = cs[k]; yes[#yes + 1] = y end
          if y ~= mask then no[#no + 1] = cs[k]; no[#no + 1] = mask - y end
        end
        stack[top + 1], stack[top + 2], stack[top + 3] = lo, mid, no
        stack[top + 4], stack[top + 5], stack[top + 6] = mid + 1, hi, yes
        top = top + 6
      end
    end
  end
  return overlap
end

-- Leading blocks of the request's chain (blob) each candidate holds: overlap[c] (nil: none);
-- slots[c] = candidate c's slot or false (worker ids are unique). Bisection for workers whose
-- 'nohole' bit says their blocks are prefix-closed, the block-by-block walk for the others.
local function overlaps(ns, model, blob, slots)
  local nohole = redis.call('GET', ns .. ':nohole:' .. model) or ''
  local band, bor = bit.band, bit.bor
  local cand, closed, open, any_closed, any_open = {}, {}, {}, false, false
  for c = 1, #slots do
    local s = slots[c]
    if s then
      local r = s % 8
      local bi, m = (s - r) / 8 + 1, MASK[r + 1]
      cand[s] = c
      if band(byte(nohole, bi) or 0, m) ~= 0 then
        closed[bi] = bor(closed[bi] or 0, m)
        any_closed = true
      else
        open[bi] = bor(open[bi] or 0, m)
        any_open = true
      end
    end
  end
  local bkey, n_hash = ns .. ':blk:' .. model, #blob / 8
  local overlap = any_open and walk(bkey, blob, n_hash, open, cand) or {}
  if any_closed then
    for c, v in pairs(bisect(bkey, blob, n_hash, closed, cand)) do overlap[c] = v end
  end
  return overlap
end

-- Take `n` blocks off a worker's reserved load; a field that reaches 0 is deleted, so the load
-- hashes hold only workers with reservations (ROUTE reads them whole).
local function unreserve(key, worker, n)
  if n ~= 0 and redis.call('HINCRBY', key, worker, -n) == 0 then redis.call('HDEL', key, worker) end
end

local function release(ns, rid)
  local r = redis.call('HMGET', ns .. ':r:' .. rid, 'w', 'm', 'p', 'd')
  if r[1] then
    unreserve(ns .. ':loadp:' .. r[2], r[1], tonumber(r[3]))
    unreserve(ns .. ':loadd:' .. r[2], r[1], tonumber(r[4]))
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

# Many batches in one call, atomically with the stream position.
# ARGV: ns, then per batch: model, worker, event_id, stream_seq, n_ops, ops; an op is
#   'S' engine_blob fleet_blob parent (stored, a chain run; parent: the first block's parent
#       fleet hash, '' root, '?' not known to be a chain: no block's parent known)
#   | 'R' engine_blob fleet_blob (removed) | 'C' (cleared)
#   | 'H' '1'/'0' (the worker's blocks are / are not prefix-closed: see ``shape``);
#   fleet_blob '' = the fleet hashes are the engine hashes. worker '' = a message with nothing to
#   apply (only the position moves). stream_seq 0 = not from the stream (always applied).
# A batch whose stream_seq is at or below the applied position is skipped (redelivery).
# Returns one character per batch: '0' skipped, '1' applied, '2' applied after an event id gap.
APPLY_MANY = (
    _COMMON
    + r"""
local ns = ARGV[1]
local pos = ns .. ':pos'
local top = tonumber(redis.call('HGET', pos, 'seq') or '0')
local moved = false
local out, seen, evids = {}, {}, {}

local function worker_state(model, worker)
  local key = model .. '\0' .. worker
  local w = seen[key]
  if w == nil then
    local evid = ns .. ':evid:' .. model
    w = {
      slot = slot_of(ns, model, worker, true),
      last = tonumber(redis.call('HGET', evid, worker) or '0'),
      blk = ns .. ':blk:' .. model,
      map = ns .. ':map:' .. model .. ':' .. worker,
    }
    seen[key] = w
    evids[evid] = evids[evid] or {}
    evids[evid][worker] = w
  end
  return w
end

-- pb: the first block's parent (8 bytes, '' root); each next block's is the one before it.
-- pb '?': the blocks are not known to form a chain (e.g. restored from a snapshot), so every
-- block's parent is unknown. Map values as in fleet_of.
local function store(w, eb, fb, pb)
  local fields, kv = {}, {}
  local chain = pb ~= '?'
  if fb == '' then
    local parent = pb
    for k = 1, #eb / 8 do
      local f = sub(eb, 8 * k - 7, 8 * k)
      fields[k] = f; kv[2 * k - 1] = f; kv[2 * k] = parent
      if chain then parent = f end
    end
  else
    local parent = pb == '' and 'r' or pb
    for k = 1, #fb / 8 do
      local f = sub(fb, 8 * k - 7, 8 * k)
      fields[k] = f; kv[2 * k - 1] = sub(eb, 8 * k - 7, 8 * k); kv[2 * k] = f .. parent
      if chain then parent = f end
    end
  end
  update_bits(w.blk, fields, w.slot, true)
  hset_chunks(w.map, kv)
end

local function remove(w, eb, fb)
  local engine = slices(eb)
  update_bits(w.blk, fb == '' and engine or slices(fb), w.slot, false)
  hdel_chunks(w.map, engine)
end

local OP_ARGS = {S = 4, R = 3, C = 1, H = 2}
local i, n = 2, #ARGV
while i <= n do
  local model, worker = ARGV[i], ARGV[i + 1]
  local eid, seq, n_ops = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])
  i = i + 5
  if seq > 0 and seq <= top then
    out[#out + 1] = '0'
    for _ = 1, n_ops do i = i + OP_ARGS[ARGV[i]] end
  elseif worker == '' then
    if seq > 0 then top = seq; moved = true end
    out[#out + 1] = '1'
    for _ = 1, n_ops do i = i + OP_ARGS[ARGV[i]] end
  else
    if seq > 0 then top = seq; moved = true end
    local w = worker_state(model, worker)
    out[#out + 1] = (w.last > 0 and eid ~= w.last + 1) and '2' or '1'
    if eid > w.last then w.last = eid; w.dirty = true end
    for _ = 1, n_ops do
      local op = ARGV[i]
      if op == 'S' then store(w, ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
      elseif op == 'R' then remove(w, ARGV[i + 1], ARGV[i + 2])
      elseif op == 'C' then clear_worker(ns, model, worker, w.slot)
      else redis.call('SETBIT', ns .. ':nohole:' .. model, w.slot, ARGV[i + 1]) end
      i = i + OP_ARGS[op]
    end
  end
end
for evid, ws in pairs(evids) do
  local kv = {}
  for worker, w in pairs(ws) do
    if w.dirty then kv[#kv + 1] = worker; kv[#kv + 1] = w.last end
  end
  if #kv > 0 then hset_chunks(evid, kv) end
end
if moved then redis.call('HSET', pos, 'seq', top) end
return table.concat(out)
"""
)

# ARGV: ns, model, worker, stream_seq (0: not from the stream)
DROP_WORKER = (
    _COMMON
    + r"""
local ns, model, worker, seq = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local slot = slot_of(ns, model, worker, false)
redis.call('HDEL', ns .. ':evid:' .. model, worker)
local n = 0
if slot ~= nil then
  n = clear_worker(ns, model, worker, slot)
  redis.call('SETBIT', ns .. ':nohole:' .. model, slot, 0)
  redis.call('HDEL', ns .. ':slot:' .. model, worker)
  redis.call('RPUSH', ns .. ':slotfree:' .. model, slot)
  save_slotmap(ns, model)
end
if seq > 0 then
  local cur = tonumber(redis.call('HGET', ns .. ':pos', 'seq') or '0')
  if seq > cur then redis.call('HSET', ns .. ':pos', 'seq', seq) end
end
return n
"""
)

# ARGV: ns, model, hash_blob -> flat {worker, blocks, worker, blocks, ...}
MATCH = (
    _COMMON
    + r"""
local ns, model, blob = ARGV[1], ARGV[2], ARGV[3]
local all = redis.call('HGETALL', ns .. ':slot:' .. model)
local slots, names = {}, {}
for k = 1, #all, 2 do
  names[#names + 1] = all[k]
  slots[#slots + 1] = tonumber(all[k + 1])
end
local overlap = overlaps(ns, model, blob, slots)
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
#       candidates, hash_blob, prefill_overhead_blocks. candidates: msgpack [[worker ids],
#       [reported prefill blocks], [reported decode blocks], [hint overlap blocks]] (columns,
#       in candidate order).
# Returns msgpack [winner_index (1-based), [overlap], [cost], [load]] (per candidate): numbers
# keep their fractions and the reply is one string (cheap to return, cheap to decode).
ROUTE = (
    _COMMON
    + r"""
local ns, model, rid = ARGV[1], ARGV[2], ARGV[3]
local now, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local pw, temp, rnd = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local new_blocks, blob, ovh = tonumber(ARGV[9]), ARGV[11], tonumber(ARGV[12])
expire_reservations(ns, now)
local cand = cmsgpack.unpack(ARGV[10])
local workers, rep_p, rep_d, hint = cand[1], cand[2], cand[3], cand[4]
local n_cand = #workers
local sm = redis.call('GET', ns .. ':slotmap:' .. model)
local slot_of_w = sm and cmsgpack.unpack(sm) or {}
local slots = {}
for c = 1, n_cand do slots[c] = slot_of_w[workers[c]] or false end
local overlap = overlaps(ns, model, blob, slots)
local loadp, loadd = ns .. ':loadp:' .. model, ns .. ':loadd:' .. model
local res_p, res_d = {}, {}  -- whole hashes: only workers with reservations have a field
local all = redis.call('HGETALL', loadp)
for k = 1, #all, 2 do res_p[all[k]] = tonumber(all[k + 1]) end
all = redis.call('HGETALL', loadd)
for k = 1, #all, 2 do res_d[all[k]] = tonumber(all[k + 1]) end
local costs, loads, best = {}, {}, math.huge
for c = 1, n_cand do
  local ov, h = overlap[c] or 0, hint[c]
  if h > ov then ov = h end
  overlap[c] = ov
  local w = workers[c]
  local ap, ad = rep_p[c], rep_d[c]
  local r = res_p[w] or 0
  if r > ap then ap = r end
  r = res_d[w] or 0
  if r > ad then ad = r end
  local need = ap + new_blocks - ov
  if need < 0 then need = 0 end
  need = need + ovh
  local cost = pw * need + ad + new_blocks
  costs[c] = cost
  loads[c] = ap + ad
  if cost < best then best = cost end
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
local p = math.max(new_blocks - overlap[winner], 0) + ovh
local d = new_blocks
if rid ~= '' then
  release(ns, rid)
  if p > 0 then redis.call('HINCRBY', loadp, w, p) end
  if d > 0 then redis.call('HINCRBY', loadd, w, d) end
  redis.call('HSET', ns .. ':r:' .. rid, 'w', w, 'm', model, 'p', p, 'd', d)
  redis.call('PEXPIRE', ns .. ':r:' .. rid, ttl)
  redis.call('ZADD', ns .. ':rexp', now + ttl, rid)
end
return cmsgpack.pack({winner, overlap, costs, loads})
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
    unreserve(ns .. ':loadp:' .. r[2], r[1], tonumber(r[3]))
    redis.call('HSET', key, 'p', 0)
  end
  return r[1] and 1 or 0
end
return release(ns, rid)
"""
)
