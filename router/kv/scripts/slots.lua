-- needs common.lua (prepended by router.kv.lua)
-- The slot table's source, on shard 0: which bit of the holder bitmaps is whose.
-- KEYS: slot, slotw, slotver, slotnext, slotfree, slotdead, nohole (of one model)
-- ARGV: op, now_ms, holder...
--   'assign': each holder keeps its slot or gets one (a swept slot from the free list, else a
--     new one); 'retire': each holder's slot leaves the table and waits in slotdead for the
--     sweeper (its bits stay until then, read by nobody); 'renew': retire, then assign (the
--     holder starts empty: a cleared cache, a heal).
-- A worker's lower tiers (holders with a space in their name) mark the table ('~tiers').
-- Returns msgpack [version, [slot of each holder, -1 when retired]].
local op, now = ARGV[1], tonumber(ARGV[2])
local slot, slotw, ver = KEYS[1], KEYS[2], KEYS[3]
local changed = false
local out = {}
local function retire(h)
  local s = redis.call('HGET', slot, h)
  if s then
    redis.call('HDEL', slot, h)
    redis.call('HDEL', slotw, s)
    redis.call('ZADD', KEYS[6], now, s)
    redis.call('SETBIT', KEYS[7], tonumber(s), 0)
    changed = true
  end
end
local function assign(h)
  local s = redis.call('HGET', slot, h)
  if s then return tonumber(s) end
  s = redis.call('LPOP', KEYS[5])
  if not s then s = redis.call('INCR', KEYS[4]) - 1 end
  redis.call('HSET', slot, h, s)
  redis.call('HSET', slotw, s, h)
  if string.find(h, ' ', 1, true) then redis.call('HSET', slot, '~tiers', 1) end
  changed = true
  return tonumber(s)
end
for k = 3, #ARGV do
  local h = ARGV[k]
  if op ~= 'assign' then retire(h) end
  out[#out + 1] = op == 'retire' and -1 or assign(h)
end
local v = changed and redis.call('INCR', ver) or tonumber(redis.call('GET', ver) or '0')
return cmsgpack.pack({v, out})
