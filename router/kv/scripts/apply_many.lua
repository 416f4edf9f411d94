-- needs common.lua (prepended by router.kv.lua)
-- Many batches in one call, atomically with the stream position.
-- ARGV: ns, then per batch: model, worker, event_id, stream_seq, n_ops, ops; an op is
--   'S' engine_blob fleet_blob parent (stored, a chain run; parent: the first block's parent
--       fleet hash, '' root, '?' not known to be a chain: no block's parent known)
--   | 'R' engine_blob fleet_blob (removed) | 'C' (cleared)
--   | 'H' '1'/'0' (the worker's blocks are / are not prefix-closed: see ``shape``)
--   | 'W' holder (the next ops are about this holder: the batch's worker or one of its lower
--       tiers, ``translate.tier_holder``; a tier has its own slot and map, no event ids);
--   fleet_blob '' = the fleet hashes are the engine hashes. worker '' = a message with nothing to
--   apply (only the position moves). stream_seq 0 = not from the stream (always applied).
-- A batch whose stream_seq is at or below the applied position is skipped (redelivery).
-- Returns one character per batch: '0' skipped, '1' applied, '2' applied after an event id gap.
local ns = ARGV[1]
local pos = ns .. ':pos'
local top = tonumber(redis.call('HGET', pos, 'seq') or '0')
local moved = false
local out, seen, evids = {}, {}, {}

local function worker_state(model, worker, tier)
  local key = model .. '\0' .. worker
  local w = seen[key]
  if w == nil then
    local evid = ns .. ':evid:' .. model
    w = {
      slot = slot_of(ns, model, worker, true),
      last = 0,
      blk = ns .. ':blk:' .. model,
      map = ns .. ':map:' .. model .. ':' .. worker,
    }
    seen[key] = w
    if not tier then
      w.last = tonumber(redis.call('HGET', evid, worker) or '0')
      evids[evid] = evids[evid] or {}
      evids[evid][worker] = w
    end
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

local OP_ARGS = {S = 4, R = 3, C = 1, H = 2, W = 2}
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
    local w = worker_state(model, worker, false)
    out[#out + 1] = (w.last > 0 and eid ~= w.last + 1) and '2' or '1'
    if eid > w.last then w.last = eid; w.dirty = true end
    local h, hw = worker, w  -- the holder the ops are about
    for _ = 1, n_ops do
      local op = ARGV[i]
      if op == 'S' then store(hw, ARGV[i + 1], ARGV[i + 2], ARGV[i + 3])
      elseif op == 'R' then remove(hw, ARGV[i + 1], ARGV[i + 2])
      elseif op == 'C' then clear_worker(ns, model, h, hw.slot)
      elseif op == 'W' then
        h = ARGV[i + 1]
        hw = h == worker and w or worker_state(model, h, true)
      else redis.call('SETBIT', ns .. ':nohole:' .. model, hw.slot, ARGV[i + 1]) end
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
