-- increment(key, delta) -> {rev, epoch, new value}. Fails (a Redis error)
-- when the current value is not an integer.
-- ARGV[5] key, ARGV[6] delta.
local key = ARGV[5]
local value = redis.call('HINCRBY', hash, key, ARGV[6])
local rev, epoch = publish('set', key, tostring(value))
expire()
return {rev, epoch, value}
