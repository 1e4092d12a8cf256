-- fail(key, token, reason, attempt) -> 1, or 0 when the token is not the
-- job's.
--
-- KEYS[1] jobs hash   KEYS[2] the job's record   KEYS[3] the worker's job set
-- ARGV[1] key  ARGV[2] token  ARGV[3] reason  ARGV[4] the attempt that failed
--
-- Marks the job failed: it stays listed with its reason and keeps its key
-- until retried or forgotten. Fenced by the token, in one step.
local job = parse(redis.call('HGET', KEYS[1], ARGV[1]))
if not job or job.token ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ownership('failed', '', job.token, job.seq))
redis.call('HSET', KEYS[2], 'reason', ARGV[3], 'attempt', ARGV[4])
note(KEYS[2], 'failed', job.worker)
redis.call('SREM', KEYS[3], ARGV[1])
return 1
