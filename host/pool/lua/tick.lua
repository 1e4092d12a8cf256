-- tick(name, interval, create, immediate, epoch)
--   -> {'wait', ms_until_due, interval, last_seq, epoch}
--    | {'fire', ms_until_next, interval, seq, missed, epoch, ms_late}
--    | {'stopped'}
-- (every item a string)
--
-- KEYS[1] tickers hash   KEYS[2] pool epoch
-- ARGV[1] ticker name  ARGV[2] interval in ms  ARGV[3] '1' to create
-- ARGV[4] '1' for a first tick due at once  ARGV[5] the epoch the caller
-- last saw ('' at first)
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
-- of another interval (the other nodes adopt it from the reply). A missing
-- field means the ticker was stopped, unless the pool epoch changed (Redis
-- lost its data): then it is created again.
local now = tonumber(now_ms())
local name = ARGV[1]
local interval = tonumber(ARGV[2])
local create = ARGV[3] == '1'
local epoch = redis.call('GET', KEYS[2]) or ''

local function start()
  local first = now + (ARGV[4] == '1' and 0 or interval)
  redis.call('HSET', KEYS[1], name, first .. ':' .. interval .. ':0')
  return {'wait', tostring(first - now), tostring(interval), '0', epoch}
end

local entry = redis.call('HGET', KEYS[1], name)
if not entry then
  if create or epoch ~= ARGV[5] then return start() end
  return {'stopped'}
end
local due, stored, seq = string.match(entry, '^(%d+):(%d+):(%d+)$')
if not due then return start() end
due, stored, seq = tonumber(due), tonumber(stored), tonumber(seq)
if create and stored ~= interval then return start() end
if now < due then return {'wait', tostring(due - now), tostring(stored), tostring(seq), epoch} end
local missed = math.floor((now - due) / stored)
local next_due = due + (missed + 1) * stored
seq = seq + missed + 1
redis.call('HSET', KEYS[1], name, next_due .. ':' .. stored .. ':' .. seq)
return {'fire', tostring(next_due - now), tostring(stored), tostring(seq), tostring(missed), epoch,
  tostring(now - due)}
