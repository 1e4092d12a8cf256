-- reap(group, dead_after_ms) -> the consumers removed.
--
-- KEYS[1]  the stream
-- KEYS[2]  the sorted set of the group's consumers (see heartbeat.lua)
-- ARGV[1]  the group
-- ARGV[2]  how long without a heartbeat makes a consumer dead, in ms
--
-- A dead consumer is removed only once it holds no pending entry: its
-- pending entries are first claimed by live consumers (after the grace
-- period), since removing a consumer discards what it holds. A consumer the
-- group knows but the set does not (the set was lost) is recorded as seen
-- now, and judged later. Atomic, so an entry cannot be claimed by a
-- consumer between the check and the removal.
local stream, consumers, group = KEYS[1], KEYS[2], ARGV[1]
if redis.call('EXISTS', stream) == 0 then return {} end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ok, infos = pcall(redis.call, 'XINFO', 'CONSUMERS', stream, group)
if not ok then return {} end
local removed = {}
for _, info in ipairs(infos) do
  local fields = {}
  for i = 1, #info, 2 do fields[info[i]] = info[i + 1] end
  local name = fields['name']
  local seen = redis.call('ZSCORE', consumers, name)
  if not seen then
    redis.call('ZADD', consumers, ms, name)
  elseif ms - tonumber(seen) > tonumber(ARGV[2]) and tonumber(fields['pending']) == 0 then
    redis.call('XGROUP', 'DELCONSUMER', stream, group, name)
    redis.call('ZREM', consumers, name)
    table.insert(removed, name)
  end
end
return removed
