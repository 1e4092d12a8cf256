-- reset_failed(key, mode) -> 1 when done, 0 when the job is not failed.
--
-- KEYS[1] jobs hash   KEYS[2] the job's record   KEYS[3] queued set
-- KEYS[4] the job's held events
-- ARGV[1] key  ARGV[2] `retry` (queue it again from attempt 1; the caller
-- then assigns it) or `forget` (remove it)
local job = parse(redis.call('HGET', KEYS[1], ARGV[1]))
if not job or job.state ~= 'failed' then return 0 end
if ARGV[2] == 'forget' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[2], KEYS[4])
  return 1
end
redis.call('HSET', KEYS[1], ARGV[1], ownership('queued', '', job.token, job.seq))
redis.call('HSET', KEYS[2], 'attempt', 1)
redis.call('HDEL', KEYS[2], 'reason')
note(KEYS[2], 'retried', '')
redis.call('SADD', KEYS[3], ARGV[1])
return 1
