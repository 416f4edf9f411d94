-- Shared helpers. CHUNK bounds the arguments of one command built with unpack() (Lua's C stack
-- takes ~8000 values). Every key a script touches carries its shard's hash tag (``keys``).
local CHUNK = 1000
local sub, byte, char = string.sub, string.byte, string.char
local band, bor = bit.band, bit.bor
local MASK = {128, 64, 32, 16, 8, 4, 2, 1}

-- byte index (1-based) and mask of a slot's bit in a holder bitmap (MSB first, like SETBIT)
local function slot_bit(s)
  local r = s % 8
  return (s - r) / 8 + 1, MASK[r + 1]
end

-- v with the bit (bi, m) set (on) or cleared; false if unchanged. Cleared bitmaps lose their
-- trailing zero bytes ('' = nobody holds the block).
local function flip(v, bi, m, on)
  local old = byte(v, bi) or 0
  if (band(old, m) ~= 0) == on then return false end
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

-- The 8-byte slices of a blob.
local function slices(blob)
  local out = {}
  for k = 1, #blob / 8 do out[k] = sub(blob, 8 * k - 7, 8 * k) end
  return out
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

-- Matching. A set of slots is a flat array {byte index, mask, ...} (masks as in a holder
-- bitmap), so testing a block against a set costs one bit.band per byte (8 slots each). Both
-- matchers return groups {overlap, flat set}: the slots of a set whose holders hold exactly the
-- first `overlap` blocks of the request's chain.

-- walk(bkey, blob, n_hash, set): block by block, in growing chunks (HMGET of raw hash fields),
-- a block whose holders are those of the block before costs nothing; a set's slots leave it
-- when they stop matching. A prompt nobody holds costs one small read.
local function walk(bkey, blob, n_hash, set)
  local groups, bis, masks, n_active = {}, {}, {}, 0
  for k = 1, #set, 2 do
    n_active = n_active + 1
    bis[n_active] = set[k]
    masks[n_active] = set[k + 1]
  end
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
          local bi, m = bis[k], masks[k]
          local nm = v and band(byte(v, bi) or 0, m) or 0
          if nm ~= m then
            groups[#groups + 1] = {i + j - 1, {bi, m - nm}}
            if nm == 0 then
              bis[k], masks[k] = bis[n_active], masks[n_active]
              bis[n_active], masks[n_active] = nil, nil
              n_active = n_active - 1
              k = k - 1
            else
              masks[k] = nm
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
  if n_active > 0 then
    local rest = {}
    for k = 1, n_active do rest[#rest + 1] = bis[k]; rest[#rest + 1] = masks[k] end
    groups[#groups + 1] = {n_hash, rest}
  end
  return groups
end

-- bits set in a byte (the leaves a limited bisection counts: a handful a call)
local function pop(m)
  local c = 0
  while m > 0 do
    local r = m % 2
    c, m = c + r, (m - r) / 2
  end
  return c
end

-- bisect(bkey, blob, n_hash, set[, limit]), for slots whose held blocks are prefix-closed
-- (holding block i of a chain means holding blocks 0..i-1, see ``keys``): a read of block `mid`
-- splits the slots whose overlap lies in [lo, hi] into those holding it (overlap in [mid+1, hi])
-- and the others ([lo, mid]), so a request costs about log2(n) reads per distinct overlap
-- instead of n. The first read is block 0: slots that do not hold it are done at once. The
-- deeper half is always taken first, so groups come deepest first: with `limit`, the search
-- stops once groups of at least that many slots with an overlap were found. (A read that does
-- not split a set passes the set on as it is: the common case allocates nothing.)
local function bisect(bkey, blob, n_hash, set, limit)
  local groups, ys = {}, {}
  local floor = math.floor
  local stack, top = {0, n_hash, set}, 3
  local found = 0
  while top > 0 do
    local lo, hi, cs = stack[top - 2], stack[top - 1], stack[top]
    top = top - 3
    local nb = #cs
    if lo == hi then
      groups[#groups + 1] = {lo, cs}
      if limit and lo > 0 then
        for k = 2, nb, 2 do found = found + pop(cs[k]) end
        if found >= limit then break end
      end
    else
      local mid = lo == 0 and 0 or floor((lo + hi) / 2)
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
  return groups
end

-- The groups of a set of slots (a flat {byte, mask} array): bisection for slots whose bit in
-- `nohole` (the value of the model's nohole key) says their blocks are prefix-closed, the
-- block-by-block walk for the others. With `limit`,
-- the bisection may stop once it found that many slots in its deepest groups (see bisect).
local function match_groups(bkey, nohole, blob, set, limit)
  local closed, open = {}, {}
  for k = 1, #set, 2 do
    local bi, m = set[k], set[k + 1]
    local c = band(byte(nohole, bi) or 0, m)
    if c ~= 0 then closed[#closed + 1] = bi; closed[#closed + 1] = c end
    if c ~= m then open[#open + 1] = bi; open[#open + 1] = m - c end
  end
  local n_hash = #blob / 8
  local groups = #open > 0 and walk(bkey, blob, n_hash, open) or {}
  if #closed > 0 then
    for _, g in ipairs(bisect(bkey, blob, n_hash, closed, limit)) do groups[#groups + 1] = g end
  end
  return groups
end

-- A flat set of the slots in a list.
local function set_of(slots)
  local by = {}
  for _, s in ipairs(slots) do
    local bi, m = slot_bit(s)
    by[bi] = bor(by[bi] or 0, m)
  end
  local set = {}
  for bi, m in pairs(by) do set[#set + 1] = bi; set[#set + 1] = m end
  return set
end

-- A flat set of the slots whose bits are set in a bitmap string, less those in `skip` (a table
-- byte index -> mask).
local function set_of_bitmap(bm, skip)
  local set, n = {}, 0
  for lo = 1, #bm, 4000 do  -- string.byte returns its bytes on Lua's C stack
    local bytes = {byte(bm, lo, math.min(lo + 3999, #bm))}
    for j = 1, #bytes do
      local m, bi = bytes[j], lo + j - 1
      if m ~= 0 then
        local s = skip[bi]
        if s then m = band(m, 255 - s) end
        if m ~= 0 then set[n + 1] = bi; set[n + 2] = m; n = n + 2 end
      end
    end
  end
  return set
end

-- extend(bkey, blob, n_hash, start, bits) -> the end of the run of blocks from `start` (0-based)
-- each held by one of the holders whose (byte index, mask) pairs are in `bits` (a worker and its
-- lower tiers): a worker's GPU prefix continued through blocks in its host tier.
local function extend(bkey, blob, n_hash, start, bits)
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
-- hashes hold only workers with reservations.
local function unreserve(key, worker, n)
  if n ~= 0 and redis.call('HINCRBY', key, worker, -n) == 0 then redis.call('HDEL', key, worker) end
end

-- ns: the shard's key prefix; reservations of requests routed on this shard
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
