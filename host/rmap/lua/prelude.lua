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

-- The change format and the netstring helpers are in library.lua
-- (prepended before this file).
local map = {hash = hash, channel = channel, epoch = ARGV[2]}

-- Publishes a change of this map (see rmap_publish). Returns rev, epoch.
local function publish(op, ...)
  return rmap_publish(map, op, {...})
end

-- A list value: its items as netstrings.
local function encode(items)
  local out = {}
  for i, item in ipairs(items) do
    out[i] = ns(item)
  end
  return table.concat(out)
end

-- The items of a list value, or nil when it is malformed.
local decode = netstrings

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
