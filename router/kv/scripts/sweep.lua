-- needs common.lua (prepended by router.kv.lua)
-- One bounded step of sweeping retired slots' bits out of a shard's holder bitmaps.
-- KEYS: blk, nohole (of one model)
-- ARGV: cursor, count, retired slot...
-- Returns the next cursor ('0': the shard is clean of these slots).
redis.replicate_commands()
local by = {}
for k = 3, #ARGV do
  local bi, m = slot_bit(tonumber(ARGV[k]))
  by[bi] = bor(by[bi] or 0, m)
end
local clear = {}  -- flat {byte index, mask}: usually one or two bytes
for bi, m in pairs(by) do clear[#clear + 1] = bi; clear[#clear + 1] = m end
local res = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', ARGV[2])
local items, kv, gone = res[2], {}, {}
for k = 1, #items, 2 do
  local v = items[k + 1]
  local nv = v
  for j = 1, #clear, 2 do
    local bi = clear[j]
    local b = byte(nv, bi)
    if b and band(b, clear[j + 1]) ~= 0 then
      nv = sub(nv, 1, bi - 1) .. char(b - band(b, clear[j + 1])) .. sub(nv, bi + 1)
    end
  end
  if nv ~= v then
    nv = string.match(nv, '^(.-)%z*$')
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
