-- set(key, value) -> {rev, epoch, previous value or nil}
-- ARGV[5] key, ARGV[6] value. Always changes the map.
local key, value = ARGV[5], ARGV[6]
local previous = redis.call('HGET', hash, key)
redis.call('HSET', hash, key, value)
local rev, epoch = publish('set', key, value)
expire()
return {rev, epoch, previous}
