-- set_if_not_exists(key, value) -> {rev, epoch}; rev 0 when the key exists.
-- ARGV[5] key, ARGV[6] value.
local key, value = ARGV[5], ARGV[6]
if redis.call('HEXISTS', hash, key) == 1 then
  expire()
  return {0, ''}
end
redis.call('HSET', hash, key, value)
local rev, epoch = publish('set', key, value)
expire()
return {rev, epoch}
