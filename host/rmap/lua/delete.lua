-- delete(key) -> {rev, epoch, previous or nil}; rev 0 when absent.
-- ARGV[5] key.
local key = ARGV[5]
local previous = redis.call('HGET', hash, key)
if not previous then
  expire()
  return {0, '', previous}
end
redis.call('HDEL', hash, key)
local rev, epoch = publish('del', key)
expire()
return {rev, epoch, previous}
