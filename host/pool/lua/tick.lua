-- tick(name, interval, create, immediate)
--   -> {'wait', ms_until_due, interval, last_seq}
--    | {'fire', ms_until_next, interval, seq, missed, ms_late}
--    | {'stopped'}
-- (every item a string)
--
-- KEYS[1] tickers hash   KEYS[2] pool epoch
-- ARGV[1] ticker name  ARGV[2] interval in ms  ARGV[3] '1' to create
-- ARGV[4] '1' for a first tick due at once
--
-- A ticker is one field: `next_due_ms:interval_ms:last_seq`, all on Redis
-- time, so the nodes' clocks never matter. Every node holding the ticker
-- calls this when its own timer says the tick is due; the one call that
-- finds it due fires tick `seq` and moves `next_due` on, atomically, so each
-- tick fires exactly once, on whichever node asks first (a dead node simply
-- stops asking). Ticks due while nobody asked (every node late or down) are
-- collapsed into the one fired, and counted as missed.
--
-- Creating adopts an existing ticker of the same interval and replaces one
-- of another interval (the other nodes adopt it from the reply) or a
-- stopped one. A stop leaves the field as `stopped`, so the other holders
-- end at their next call. A missing field means Redis lost the pool's data
-- or the pool was shut down: with a pool epoch present (the pool exists
-- again) the ticker is created anew; without one, the holders wait,
-- firing nothing, until it is.
local now = tonumber(now_ms())
local name = ARGV[1]
local interval = tonumber(ARGV[2])
local create = ARGV[3] == '1'

local function start()
  local first = now + (ARGV[4] == '1' and 0 or interval)
  redis.call('HSET', KEYS[1], name, first .. ':' .. interval .. ':0')
  return {'wait', tostring(first - now), tostring(interval), '0'}
end

local entry = redis.call('HGET', KEYS[1], name)
if entry == 'stopped' then
  if create then return start() end
  return {'stopped'}
end
if not entry then
  if create or redis.call('EXISTS', KEYS[2]) == 1 then return start() end
  return {'wait', tostring(interval), tostring(interval), '0'}
end
local due, stored, seq = string.match(entry, '^(%d+):(%d+):(%d+)$')
if not due then return start() end
due, stored, seq = tonumber(due), tonumber(stored), tonumber(seq)
if create and stored ~= interval then return start() end
if now < due then return {'wait', tostring(due - now), tostring(stored), tostring(seq)} end
local missed = math.floor((now - due) / stored)
local next_due = due + (missed + 1) * stored
seq = seq + missed + 1
redis.call('HSET', KEYS[1], name, next_due .. ':' .. stored .. ':' .. seq)
return {'fire', tostring(next_due - now), tostring(stored), tostring(seq), tostring(missed),
  tostring(now - due)}
