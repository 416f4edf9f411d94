-- needs common.lua (prepended by router.kv.lua)
-- A shard's copy of the slot table, replaced by a newer one (the routes of the shard read it).
-- KEYS: slot, slotw, slotver, nohole (of one model)
-- ARGV: version, n_retired, retired slot..., then holder, slot pairs (the whole table).
-- Returns 1 if the copy was replaced, 0 if it was as new already.
local v = tonumber(ARGV[1])
if v <= tonumber(redis.call('GET', KEYS[3]) or '0') then return 0 end
local n_dead = tonumber(ARGV[2])
for k = 3, 2 + n_dead do redis.call('SETBIT', KEYS[4], tonumber(ARGV[k]), 0) end
redis.call('DEL', KEYS[1], KEYS[2])
local kv, rev = {}, {}
for k = 3 + n_dead, #ARGV, 2 do
  kv[#kv + 1] = ARGV[k]; kv[#kv + 1] = ARGV[k + 1]
  if ARGV[k] ~= '~tiers' then rev[#rev + 1] = ARGV[k + 1]; rev[#rev + 1] = ARGV[k] end
end
hset_chunks(KEYS[1], kv)
hset_chunks(KEYS[2], rev)
redis.call('SET', KEYS[3], v)
return 1
