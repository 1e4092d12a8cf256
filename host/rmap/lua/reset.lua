-- reset(key1, test1, key2, test2, …) -> {rev, epoch}: removes every user
-- field when every listed key holds its test value (a missing key never
-- matches); with no pairs, unconditionally. Keeps `=epoch` and `=rev`.
-- ARGV[5…] the pairs.
for i = 5, #ARGV, 2 do
  if redis.call('HGET', hash, ARGV[i]) ~= ARGV[i + 1] then
    expire()
    return {0, ''}
  end
end
for _, field in ipairs(redis.call('HKEYS', hash)) do
  if string.sub(field, 1, 1) ~= '=' then
    redis.call('HDEL', hash, field)
  end
end
local rev, epoch = publish('reset')
expire()
return {rev, epoch}
