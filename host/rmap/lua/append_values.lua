-- append_values(unique, key, items…) -> {rev, epoch, new value or nil}.
-- Lists are netstring sequences; appending adds the encoded items at the
-- end, and the change message carries only those (O(1) in the list size).
-- With unique = 1, items already present (or repeated in the call) are
-- skipped. A value that is not a list is appended to all the same (it does
-- not become one). rev is 0 when nothing was added.
-- ARGV[5] unique (0/1), ARGV[6] key, ARGV[7…] items.
local unique, key = ARGV[5] == '1', ARGV[6]
local current = redis.call('HGET', hash, key)
local seen = {}
if unique then
  for _, item in ipairs(decode(current) or {}) do
    seen[item] = true
  end
end
local added = {}
for i = 7, #ARGV do
  local item = ARGV[i]
  if not seen[item] then
    table.insert(added, item)
    if unique then seen[item] = true end
  end
end
if #added == 0 then
  expire()
  return {0, '', current}
end
local suffix = encode(added)
local value = (current or '') .. suffix
redis.call('HSET', hash, key, value)
local rev, epoch = publish('append', key, suffix)
expire()
return {rev, epoch, value}
