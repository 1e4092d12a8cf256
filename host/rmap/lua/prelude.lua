-- Shared head of every mutation script (scripts.rs prepends it).
--
-- KEYS[1]  the map's hash: user fields, plus `=epoch` (a random id chosen
--          when the hash is created) and `=rev` (bumped by one per change).
-- ARGV[1]  the map's change channel
-- ARGV[2]  the epoch to use if the hash has none (it was never created,
--          was destroyed, expired, or Redis lost it)
-- ARGV[3]  time to live in ms, 0 for none
-- ARGV[4]  `sliding` (every write renews it) or `absolute` (set once)
-- ARGV[5…] the operation's own arguments
--
-- Why scripts: the change, the revision bump and the publication of the
-- change must be one atomic step, or replicas could see revisions out of
-- order or miss a change. Every change bumps `=rev` by exactly one and
-- publishes it, so a replica that sees a gap knows it missed something.
--
-- Every script returns {rev, epoch, ...}: rev is 0 when nothing changed.

local hash = KEYS[1]
local channel = ARGV[1]

-- A netstring: length, colon, bytes, comma. Change messages and list
-- values are sequences of them: binary-safe, canonical, easy to parse.
local function ns(s)
  return #s .. ':' .. s .. ','
end

local function encode(items)
  local out = {}
  for i, item in ipairs(items) do
    out[i] = ns(item)
  end
  return table.concat(out)
end

-- The items of a list value, or nil when the value is not a well-formed
-- list. Every iteration moves `pos` forward, so it ends on any input.
local function decode(value)
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

-- Bumps the revision (creating the epoch if needed) and publishes
-- op, epoch, rev and the arguments. Returns rev, epoch.
local function publish(op, ...)
  local epoch = redis.call('HGET', hash, '=epoch')
  if not epoch then
    epoch = ARGV[2]
    redis.call('HSET', hash, '=epoch', epoch)
  end
  local rev = redis.call('HINCRBY', hash, '=rev', 1)
  local message = ns(op) .. ns(epoch) .. ns(tostring(rev))
  for _, arg in ipairs({...}) do
    message = message .. ns(arg)
  end
  redis.call('PUBLISH', channel, message)
  return rev, epoch
end

-- Applies the map's time to live, in the same atomic step as the change.
local function expire()
  local ttl = tonumber(ARGV[3])
  if ttl > 0 and redis.call('EXISTS', hash) == 1 then
    if ARGV[4] == 'sliding' then
      redis.call('PEXPIRE', hash, ttl)
    else
      redis.call('PEXPIRE', hash, ttl, 'NX')
    end
  end
end
