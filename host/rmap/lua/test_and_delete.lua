-- test_and_delete(key, test) -> {rev, epoch, previous or nil}: deletes only
-- when the current value equals test.
-- ARGV[5] key, ARGV[6] test.
local key, test = ARGV[5], ARGV[6]
local previous = redis.call('HGET', hash, key)
if previous ~= test then
  expire()
  return {0, '', previous}
end
redis.call('HDEL', hash, key)
local rev, epoch = publish('del', key)
expire()
return {rev, epoch, previous}
