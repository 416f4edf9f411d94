-- needs common.lua (prepended by router.kv.lua)
-- One atomic routing step on one shard: expire old reservations, match, score the candidates,
-- pick, reserve. Every key is the shard's (KEYS, below); reservations found in the expiry set
-- share the shard's tag.
-- KEYS: blk, nohole, slot, slotw, slotver, loadp, loadd, rexp
-- ARGV: ns (the shard's key prefix), model, request_id, now_ms, ttl_ms, prefill_weight,
--   temperature, rand01, new_blocks, candidates, hash_blob, prefill_overhead_blocks, host_weight,
--   slot_version, eligible, reported, max_holders.
-- candidates: msgpack [[worker ids], [reported prefill blocks], [reported decode blocks], [hint
--   overlap blocks]]: the router's sample of its pool and its hinted workers, always scored.
-- eligible: a bitmap of the slots the router may send the request to ('' = only the
--   candidates); reported: 8 bytes per slot, the reported prefill and decode blocks as big-endian
--   float32. Both were built from the slot table of version slot_version (the reply's version
--   tells the router when to read it again).
-- Besides the candidates, the eligible holders of the request's deepest blocks are scored:
--   groups of equal overlap, deepest first, up to max_holders slots in all.
-- Returns msgpack [winner (1-based), version, [worker ids], [overlap], [cost], [load]] (per
--   scored candidate).
local ns, model, rid = ARGV[1], ARGV[2], ARGV[3]
local now, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local pw, temp, rnd = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local new_blocks, blob, ovh = tonumber(ARGV[9]), ARGV[11], tonumber(ARGV[12])
local hw = tonumber(ARGV[13])
local bkey, nhkey, slotkey, slotwkey = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local loadp, loadd = KEYS[6], KEYS[7]
expire_reservations(ns, now)
local version = tonumber(redis.call('GET', KEYS[5]) or '0')
-- a router's bitmap of another version is used all the same: a slot changes hands only after
-- a sweep, seconds after it was retired, and a slot the copy does not know names nobody
local elig, rep = ARGV[15], ARGV[16]  -- (eligible slots in the sample are matched with it)
local max_holders = tonumber(ARGV[17])
local cand = cmsgpack.unpack(ARGV[10])
local ids, rep_p, rep_d, hint = cand[1], cand[2], cand[3], cand[4]
local n_cand = #ids

-- the candidates' slots (none yet: no blocks)
local slot_of, known = {}, {}
local cslots = n_cand > 0 and redis.call('HMGET', slotkey, unpack(ids)) or {}
for c = 1, n_cand do
  local s = cslots[c] and tonumber(cslots[c])
  slot_of[c] = s
  if s then known[#known + 1] = s end
end
local n_hash = #blob / 8
local cset = set_of(known)
-- the eligible slots (less the candidates): their holders of the deepest blocks are scored too
local eset = {}
if elig ~= '' and max_holders > 0 and n_hash > 0 then
  local skip = {}
  for k = 1, #cset, 2 do skip[cset[k]] = cset[k + 1] end
  eset = set_of_bitmap(elig, skip)
end
local nohole = (#cset > 0 or #eset > 0) and redis.call('GET', nhkey) or ''
local cgroups = n_hash > 0 and #cset > 0 and match_groups(bkey, nohole, blob, cset) or {}
local groups = #eset > 0 and match_groups(bkey, nohole, blob, eset, max_holders) or {}
local ov_of_slot = {}
for _, g in ipairs(cgroups) do
  local cs = g[2]
  for k = 1, #cs, 2 do
    local base = (cs[k] - 1) * 8
    for b = 1, 8 do
      if band(cs[k + 1], MASK[b]) ~= 0 then ov_of_slot[base + b - 1] = g[1] end
    end
  end
end
local overlap, rp, rd = {}, {}, {}
for c = 1, n_cand do
  local s = slot_of[c]
  overlap[c] = s and ov_of_slot[s] or 0
  rp[c], rd[c] = tonumber(rep_p[c]), tonumber(rep_d[c])
end

-- the holders of the deepest blocks among the eligible slots, up to max_holders
if #groups > 0 then
  table.sort(groups, function(a, b) return a[1] > b[1] end)
  local picked, pov = {}, {}
  for _, g in ipairs(groups) do
    if g[1] <= 0 or #picked >= max_holders then break end
    local cs = g[2]
    for k = 1, #cs, 2 do
      local m = cs[k + 1]
      local base = (cs[k] - 1) * 8
      for b = 1, 8 do
        if band(m, MASK[b]) ~= 0 then
          picked[#picked + 1] = base + b - 1
          pov[#picked] = g[1]
          if #picked >= max_holders then break end
        end
      end
      if #picked >= max_holders then break end
    end
  end
  if #picked > 0 then
    local names = redis.call('HMGET', slotwkey, unpack(picked))
    for j = 1, #picked do
      local w = names[j]
      if w then
        n_cand = n_cand + 1
        ids[n_cand], overlap[n_cand], hint[n_cand] = w, pov[j], 0
        slot_of[n_cand] = picked[j]
        local off = 8 * picked[j] + 1
        if #rep >= off + 7 then
          rp[n_cand], rd[n_cand] = struct.unpack('>f>f', rep, off)
        else
          rp[n_cand], rd[n_cand] = 0, 0
        end
      end
    end
  end
end

-- A worker with lower tiers (``translate.tier_holder``): its GPU prefix continues through blocks
-- held in any of its tiers, each counted as host_weight of a block (rounded down).
if hw > 0 and n_cand > 0 and redis.call('HEXISTS', slotkey, '~tiers') == 1 then
  local names = {}
  for c = 1, n_cand do names[2 * c - 1] = ids[c] .. ' CPU'; names[2 * c] = ids[c] .. ' DISK' end
  local ts = redis.call('HMGET', slotkey, unpack(names))
  for c = 1, n_cand do
    local bits = {}
    for t = 2 * c - 1, 2 * c do
      if ts[t] then local bi, m = slot_bit(tonumber(ts[t])); bits[#bits + 1] = bi; bits[#bits + 1] = m end
    end
    if #bits > 0 then
      if slot_of[c] then local bi, m = slot_bit(slot_of[c]); bits[#bits + 1] = bi; bits[#bits + 1] = m end
      local g = overlap[c]
      local t = extend(bkey, blob, n_hash, g, bits)
      if t > g then overlap[c] = g + math.floor(hw * (t - g)) end
    end
  end
end

local res_p = n_cand > 0 and redis.call('HMGET', loadp, unpack(ids)) or {}
local res_d = n_cand > 0 and redis.call('HMGET', loadd, unpack(ids)) or {}
local costs, loads, best = {}, {}, math.huge
for c = 1, n_cand do
  local ov, h = overlap[c], hint[c]
  if h > ov then ov = h end
  overlap[c] = ov
  local ap, ad = rp[c], rd[c]
  local r = tonumber(res_p[c] or 0)
  if r > ap then ap = r end
  r = tonumber(res_d[c] or 0)
  if r > ad then ad = r end
  local need = ap + new_blocks - ov
  if need < 0 then need = 0 end
  need = need + ovh
  local cost = pw * need + ad + new_blocks  -- mirrors router.kv.routing.route_cost
  costs[c] = cost
  loads[c] = ap + ad
  if cost < best then best = cost end
end
if n_cand == 0 then return cmsgpack.pack({0, version, {}, {}, {}, {}}) end
local winner
if temp > 0 then
  local total, weights = 0, {}
  local cut = 4 * temp  -- router.kv.routing.SOFTMAX_CUTOFF temperatures: clear losers not drawn
  for c = 1, n_cand do
    local gap = costs[c] - best
    weights[c] = gap <= cut and math.exp(-gap / temp) or 0
    total = total + weights[c]
  end
  local acc, target = 0, rnd * total
  winner = n_cand
  while weights[winner] == 0 do winner = winner - 1 end  -- rand at its top end
  for c = 1, n_cand do
    acc = acc + weights[c]
    if target < acc then winner = c break end
  end
else
  local ties = {}
  for c = 1, n_cand do if costs[c] == best then ties[#ties + 1] = c end end
  winner = ties[math.min(#ties, math.floor(rnd * #ties) + 1)]
end
local w = ids[winner]
local p = math.max(new_blocks - overlap[winner], 0) + ovh
local d = new_blocks
if rid ~= '' then
  release(ns, rid)
  if p > 0 then redis.call('HINCRBY', loadp, w, p) end
  if d > 0 then redis.call('HINCRBY', loadd, w, d) end
  redis.call('HSET', ns .. ':r:' .. rid, 'w', w, 'm', model, 'p', p, 'd', d)
  redis.call('PEXPIRE', ns .. ':r:' .. rid, ttl)
  redis.call('ZADD', KEYS[8], now + ttl, rid)
end
return cmsgpack.pack({winner, version, ids, overlap, costs, loads})
