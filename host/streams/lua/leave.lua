-- leave(group, consumer) -> 1 when the consumer was removed, else 0.
--
-- KEYS[1]  the stream
-- KEYS[2]  the sorted set of the group's consumers
-- ARGV[1]  the group, ARGV[2] the consumer
--
-- A consumer that closes removes itself only if it holds no pending entry;
-- otherwise it stays, so live consumers claim its entries after the grace
-- period, and it is removed later as a dead consumer. Atomic, as reap.lua.
local stream, consumers, group, consumer = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
if redis.call('EXISTS', stream) == 0 then
  redis.call('ZREM', consumers, consumer)
  return 1
end
local ok, pending = pcall(redis.call, 'XPENDING', stream, group, '-', '+', 1, consumer)
if ok and #pending > 0 then return 0 end
if ok then redis.call('XGROUP', 'DELCONSUMER', stream, group, consumer) end
redis.call('ZREM', consumers, consumer)
return 1
