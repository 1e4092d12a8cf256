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
local rev, epoch = rmap_clear(map)
expire()
return {rev, epoch}
