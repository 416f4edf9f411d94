-- needs common.lua (prepended by router.kv.lua)
-- KEYS: the reservation, rexp (of the shard the request was routed on)
-- ARGV: ns (the shard's key prefix), request_id, part ('all' | 'prefill')
local ns, rid, part = ARGV[1], ARGV[2], ARGV[3]
if part == 'prefill' then
  local r = redis.call('HMGET', KEYS[1], 'w', 'm', 'p')
  if r[1] and tonumber(r[3]) ~= 0 then
    unreserve(ns .. ':loadp:' .. r[2], r[1], tonumber(r[3]))
    redis.call('HSET', KEYS[1], 'p', 0)
  end
  return r[1] and 1 or 0
end
return release(ns, rid)
