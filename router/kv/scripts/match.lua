-- needs common.lua (prepended by router.kv.lua)
-- Every holder's overlap with a chain (diagnostics and replay: reads the whole slot table).
-- KEYS: blk, nohole, slotw (of one model). ARGV: hash_blob
-- Returns flat {holder, blocks, holder, blocks, ...} for holders with blocks > 0.
local all = redis.call('HGETALL', KEYS[3])
local slots, name = {}, {}
for k = 1, #all, 2 do
  local s = tonumber(all[k])
  slots[#slots + 1] = s
  name[s] = all[k + 1]
end
local out = {}
if #slots == 0 or #ARGV[1] == 0 then return out end
local nohole = redis.call('GET', KEYS[2]) or ''
for _, g in ipairs(match_groups(KEYS[1], nohole, ARGV[1], set_of(slots))) do
  if g[1] > 0 then
    local cs = g[2]
    for k = 1, #cs, 2 do
      local base = (cs[k] - 1) * 8
      for b = 1, 8 do
        if band(cs[k + 1], MASK[b]) ~= 0 then
          out[#out + 1] = name[base + b - 1]
          out[#out + 1] = g[1]
        end
      end
    end
  end
end
return out
