-- Writing a replicated map, for this crate's scripts and for other crates'
-- scripts that must change a map atomically with keys of their own (a
-- pool's slot table together with its jobs). `pulse_rmap::SCRIPT_LIBRARY`
-- exports this file; the change format lives here only.
--
-- A map is passed as {hash = its Redis hash, channel = its change channel,
-- epoch = the epoch to create if the hash has none}. These functions do
-- not apply a time to live: maps written from foreign scripts have none.

-- A netstring: length, colon, bytes, comma. Change messages and list
-- values are sequences of them: binary-safe, canonical, easy to parse.
-- Their `length:` heads are kept by length for the call: Lua turns a
-- number into text by printing a double, which is most of what a
-- netstring costs, and lengths repeat.
local ns_heads = {}
local function ns_head(n)
  local head = ns_heads[n]
  if not head then
    head = string.format('%d:', n)
    ns_heads[n] = head
  end
  return head
end
local function ns(s)
  return ns_head(#s) .. s .. ','
end

-- The items of a sequence of netstrings, or nil when it is malformed.
-- Every iteration moves `pos` forward, so it ends on any input.
local function netstrings(value)
  local items, pos = {}, 1
  if not value then return items end
  while pos <= #value do
    local colon = string.find(value, ':', pos, true)
    if not colon then return nil end
    local digits = string.sub(value, pos, colon - 1)
    if not string.match(digits, '^%d+$') then return nil end
    local len = tonumber(digits)
    if string.sub(value, colon + len + 1, colon + len + 1) ~= ',' then return nil end
    table.insert(items, string.sub(value, colon + 1, colon + len))
    pos = colon + len + 2
  end
  return items
end

-- Bumps the map's revision (creating its epoch if needed) and publishes
-- op, epoch, rev and the arguments (a list): every change bumps `=rev` by
-- exactly one and publishes it, so a replica that sees a gap knows it
-- missed one. Returns rev, epoch.
local function rmap_publish(map, op, args)
  local epoch = redis.call('HGET', map.hash, '=epoch')
  if not epoch then
    epoch = map.epoch
    redis.call('HSET', map.hash, '=epoch', epoch)
  end
  local rev = redis.call('HINCRBY', map.hash, '=rev', 1)
  local parts = {ns(op), ns(epoch), ns(tostring(rev))}
  for _, arg in ipairs(args) do
    parts[#parts + 1] = ns(arg)
  end
  redis.call('PUBLISH', map.channel, table.concat(parts))
  return rev, epoch
end

-- Sets `key` to `value` and publishes the change.
local function rmap_set(map, key, value)
  redis.call('HSET', map.hash, key, value)
  return rmap_publish(map, 'set', {key, value})
end

-- Sets many keys as one change: `pairs_list` is {key1, value1, key2,
-- value2, ...}. One revision and one message (`mset`) however many keys
-- change, so replicas apply them together and subscribers hear of them
-- once. Returns rev, epoch; 0 when the list is empty (nothing published).
local function rmap_set_many(map, pairs_list)
  if #pairs_list == 0 then return 0 end
  -- HSET in batches: Lua's unpack takes at most about 8,000 values.
  for first = 1, #pairs_list, 1000 do
    redis.call('HSET', map.hash, unpack(pairs_list, first, math.min(first + 999, #pairs_list)))
  end
  return rmap_publish(map, 'mset', pairs_list)
end

-- Deletes `key`, publishing the change if it was there.
local function rmap_del(map, key)
  if redis.call('HDEL', map.hash, key) == 0 then return 0 end
  return rmap_publish(map, 'del', {key})
end

-- Removes every user field (keeps `=epoch` and `=rev`) and publishes
-- `reset`.
local function rmap_clear(map)
  for _, field in ipairs(redis.call('HKEYS', map.hash)) do
    if string.sub(field, 1, 1) ~= '=' then
      redis.call('HDEL', map.hash, field)
    end
  end
  return rmap_publish(map, 'reset', {})
end

-- The user entries of a map (without `=epoch` and `=rev`), as a table.
local function rmap_entries(map)
  local all = redis.call('HGETALL', map.hash)
  local entries = {}
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 1) ~= '=' then entries[all[i]] = all[i + 1] end
  end
  return entries
end
