-- needs common.lua (prepended by router.kv.lua)
-- Retired slots swept clean on every shard go back to the free list (shard 0).
-- KEYS: slotdead, slotfree (of one model). ARGV: slot...
-- Returns how many were freed.
local n = 0
for k = 1, #ARGV do
  if redis.call('ZREM', KEYS[1], ARGV[k]) == 1 then
    redis.call('RPUSH', KEYS[2], ARGV[k])
    n = n + 1
  end
end
return n
