-- set_many(key1, value1, key2, value2, ...) -> {rev, epoch}: sets every
-- pair as one change (one revision, one `mset` message).
-- ARGV[5...] the pairs.
local entries = {}
for i = 5, #ARGV do
  entries[#entries + 1] = ARGV[i]
end
local rev, epoch = rmap_set_many(map, entries)
expire()
return {rev, epoch or ''}
