-- Shared helpers. CHUNK bounds the arguments of one command built with unpack() (Lua's C stack
-- takes ~8000 values).
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

-- extend(bkey, blob, n_hash, start, bits) -> the end of the run of blocks from `start` (0-based)
-- each held by one of the holders whose (byte index, mask) pairs are in `bits` (a worker and its
-- lower tiers): a worker's GPU prefix continued through blocks in its host tier.
local function extend(bkey, blob, n_hash, start, bits)
  local band = bit.band
  local i, chunk = start, 16
  while i < n_hash do
    local hi = math.min(i + chunk, n_hash)
    local fields = {}
    for j = i + 1, hi do fields[j - i] = sub(blob, 8 * j - 7, 8 * j) end
    local vals = redis.call('HMGET', bkey, unpack(fields))
    for j = 1, #vals do
      local v, held = vals[j], false
      if v then
        for k = 1, #bits, 2 do
          if band(byte(v, bits[k]) or 0, bits[k + 1]) ~= 0 then held = true; break end
        end
      end
      if not held then return i + j - 1 end
    end
    i = hi
    chunk = math.min(chunk * 4, CHUNK)
  end
  return n_hash
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
