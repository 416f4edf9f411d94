-- needs common.lua (prepended by router.kv.lua)
-- One bounded step of sweeping retired slots' bits out of a shard's holder bitmaps.
-- KEYS: blk, nohole (of one model)
-- ARGV: cursor, count, retired slot...
-- Returns the next cursor ('0': the shard is clean of these slots).
redis.replicate_commands()
local clear = {}
for k = 3, #ARGV do
  local bi, m = slot_bit(tonumber(ARGV[k]))
  clear[bi] = bor(clear[bi] or 0, m)
end
local res = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local items, kv, gone = res[2], {}, {}
for k = 1, #items, 2 do
  local v = items[k + 1]
  local changed = false
  local parts = {}
  for bi = 1, #v do
    local b = byte(v, bi)
    local m = clear[bi]
    if m and band(b, m) ~= 0 then b = b - band(b, m); changed = true end
    parts[bi] = char(b)
  end
  if changed then
    local nv = string.match(table.concat(parts), '^(.-)%z*$')
    if nv == '' then gone[#gone + 1] = items[k]
    else kv[#kv + 1] = items[k]; kv[#kv + 1] = nv end
  end
end
hset_chunks(KEYS[1], kv)
hdel_chunks(KEYS[1], gone)
if res[1] == '0' then
  for k = 3, #ARGV do redis.call('SETBIT', KEYS[2], tonumber(ARGV[k]), 0) end
end
return res[1]
