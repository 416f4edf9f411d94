-- needs common.lua (prepended by router.kv.lua)
-- ARGV: ns, model, hash_blob -> flat {worker, blocks, worker, blocks, ...}
local ns, model, blob = ARGV[1], ARGV[2], ARGV[3]
local all = redis.call('HGETALL', ns .. ':slot:' .. model)
local slots, names = {}, {}
for k = 1, #all, 2 do
  names[#names + 1] = all[k]
  slots[#slots + 1] = tonumber(all[k + 1])
end
local overlap = overlaps(ns, model, blob, slots)
local out = {}
for idx, blocks in pairs(overlap) do
  if blocks > 0 then
    out[#out + 1] = names[idx]
    out[#out + 1] = blocks
  end
end
return out
