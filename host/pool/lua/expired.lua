-- expired(grace) -> {ms until the next may be, or -1, worker, worker, ...}
--
-- KEYS[1] leases
-- ARGV[1] grace in ms
--
-- Reads, writes nothing: every worker whose lease ended more than the
-- grace ago, on Redis time (by then it fenced itself: it stops its jobs
-- before its lease ends), and when the next one may be: the earliest
-- lease's end plus the grace, in ms from now, so the janitor can wake then
-- rather than at its next tick. A script only for Redis's clock: the
-- eviction that follows (evict.lua) needs each worker's keys named before
-- it runs, so the caller learns the workers here first.
local now, grace = tonumber(now_ms()), tonumber(ARGV[1])
local earliest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local next_ms = earliest[2] and math.max(0, tonumber(earliest[2]) + grace - now) or -1
local out = {next_ms}
for _, worker in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now - grace)) do
  table.insert(out, worker)
end
return out
