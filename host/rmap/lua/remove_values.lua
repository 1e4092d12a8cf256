-- remove_values(key, items…) -> {rev, epoch, remaining value or nil}:
-- drops every occurrence of every item. A list left empty is deleted
-- (message `del`); otherwise the message `remove` carries the items, and
-- replicas filter their copy the same way. rev is 0 when nothing changed,
-- which includes a value that is not a list.
-- ARGV[5] key, ARGV[6…] items.
local key = ARGV[5]
local current = redis.call('HGET', hash, key)
if not current then
  expire()
  return {0, '', current}
end
local drop, removed = {}, {}
for i = 6, #ARGV do
  drop[ARGV[i]] = true
  table.insert(removed, ARGV[i])
end
local items = decode(current)
if not items then
  expire()
  return {0, '', current}
end
local kept, changed = {}, false
for _, item in ipairs(items) do
  if drop[item] then changed = true else table.insert(kept, item) end
end
if not changed then
  expire()
  return {0, '', current}
end
if #kept == 0 then
  redis.call('HDEL', hash, key)
  local rev, epoch = publish('del', key)
  expire()
  return {rev, epoch, false}
end
local value = encode(kept)
redis.call('HSET', hash, key, value)
local rev, epoch = publish('remove', key, encode(removed))
expire()
return {rev, epoch, value}
