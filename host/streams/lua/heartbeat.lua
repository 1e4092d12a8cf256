-- heartbeat(consumer) -> the time recorded, in ms.
--
-- KEYS[1]  the sorted set of a group's consumers, scored by their last
--          heartbeat (ms, Redis time)
-- ARGV[1]  the consumer
--
-- Why a script: the time must be Redis's, not the consumer's machine's, so
-- every consumer judges liveness on one clock.
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZADD', KEYS[1], ms, ARGV[1])
return ms
