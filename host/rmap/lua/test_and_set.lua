-- test_and_set(key, test, value) -> {rev, epoch, previous or nil}: sets
-- only when the current value equals test; a missing key never matches.
-- ARGV[5] key, ARGV[6] test, ARGV[7] value.
local key, test, value = ARGV[5], ARGV[6], ARGV[7]
local previous = redis.call('HGET', hash, key)
if previous ~= test then
  expire()
  return {0, '', previous}
end
redis.call('HSET', hash, key, value)
local rev, epoch = publish('set', key, value)
expire()
return {rev, epoch, previous}
