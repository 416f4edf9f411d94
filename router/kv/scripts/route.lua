-- needs common.lua (prepended by router.kv.lua)
-- One atomic routing step: expire old reservations, match, score every candidate, pick, reserve.
-- ARGV: ns, model, request_id, now_ms, ttl_ms, prefill_weight, temperature, rand01, new_blocks,
--       candidates, hash_blob, prefill_overhead_blocks, host_weight. candidates: msgpack [[worker ids],
--       [reported prefill blocks], [reported decode blocks], [hint overlap blocks]] (columns,
--       in candidate order).
-- Returns msgpack [winner_index (1-based), [overlap], [cost], [load]] (per candidate): numbers
-- keep their fractions and the reply is one string (cheap to return, cheap to decode).
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
-- A worker with lower tiers (``translate.tier_holder``): its GPU prefix continues through blocks
-- held in any of its tiers, each counted as host_weight of a block (rounded down).
local hw = tonumber(ARGV[13] or '0')
if hw > 0 then
  local bkey, n_hash = ns .. ':blk:' .. model, #blob / 8
  for c = 1, n_cand do
    local bits = {}
    for _, tier in ipairs({' CPU', ' DISK'}) do
      local s = slot_of_w[workers[c] .. tier]
      if s then local bi, m = slot_bit(s); bits[#bits + 1] = bi; bits[#bits + 1] = m end
    end
    if #bits > 0 then
      if slots[c] then local bi, m = slot_bit(slots[c]); bits[#bits + 1] = bi; bits[#bits + 1] = m end
      local g = overlap[c] or 0
      local t = extend(bkey, blob, n_hash, g, bits)
      if t > g then overlap[c] = g + math.floor(hw * (t - g)) end
    end
  end
end
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
  local cost = pw * need + ad + new_blocks  -- mirrors router.kv.routing.route_cost
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
