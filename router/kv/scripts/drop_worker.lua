-- needs common.lua (prepended by router.kv.lua)
-- ARGV: ns, model, worker, stream_seq (0: not from the stream)
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
