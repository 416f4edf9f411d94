-- needs common.lua (prepended by router.kv.lua)
-- Many batches' block events on one shard, atomically with the shard's stream position.
-- KEYS: pos, then blk, nohole, evid of each model of the call, in ARGV's model order.
-- ARGV: group (the indexer group whose position this is), n_models, model..., then per batch:
--   model index (1-based), stream_seq, worker, event_id, n_ops, ops; an op is
--   'S' slot blob (the blocks of the blob are now held by the holder in that slot)
--   | 'R' slot blob (no longer held) | 'H' slot '1'/'0' (its blocks are / are not prefix-closed).
--   stream_seq 0 = not the end of a stream message (a piece of one, or not from the stream):
--   always applied, the position is left alone. worker '' = nothing to record.
-- A batch whose stream_seq is at or below the shard's position for the group is skipped
-- (redelivery, or a batch split over calls of which this one had landed before a restart).
-- Returns one character per batch: '0' skipped, '1' applied.
redis.replicate_commands()
local group, n_models = ARGV[1], tonumber(ARGV[2])
local top = tonumber(redis.call('HGET', KEYS[1], group) or '0')
local moved = false
local out, evids = {}, {}
local i, n = 3 + n_models, #ARGV
while i <= n do
  local mi, seq, worker = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), ARGV[i + 2]
  local eid, n_ops = ARGV[i + 3], tonumber(ARGV[i + 4])
  i = i + 5
  local k = 2 + 3 * (mi - 1)
  if seq > 0 and seq <= top then
    out[#out + 1] = '0'
    i = i + 3 * n_ops
  else
    if seq > 0 then top = seq; moved = true end
    out[#out + 1] = '1'
    if worker ~= '' then
      local ev = evids[mi] or {}
      evids[mi] = ev
      ev[worker] = eid
    end
    for _ = 1, n_ops do
      local op, slot, arg = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
      if op == 'S' then update_bits(KEYS[k], slices(arg), slot, true)
      elseif op == 'R' then update_bits(KEYS[k], slices(arg), slot, false)
      else redis.call('SETBIT', KEYS[k + 1], slot, arg) end
      i = i + 3
    end
  end
end
for mi, ev in pairs(evids) do
  local kv = {}
  for worker, eid in pairs(ev) do kv[#kv + 1] = worker; kv[#kv + 1] = eid end
  hset_chunks(KEYS[2 + 3 * (mi - 1) + 2], kv)
end
if moved then redis.call('HSET', KEYS[1], group, top) end
return table.concat(out)
