-- finish(key, token) -> 1 when the job was removed, 0 when the token is
-- no longer the job's (it moved or was removed already).
--
-- KEYS[1] jobs hash   KEYS[2] the job's record   KEYS[3] the job's held events
-- KEYS[4] the worker's job set
-- ARGV[1] key  ARGV[2] the token the worker holds
--
-- Ends a job for good: stopped, completed, or refused at start. Fenced by
-- the token in one step, so a worker that lost the job cannot remove it
-- from its new owner.
local job = parse(redis.call('HGET', KEYS[1], ARGV[1]))
if not job or job.token ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('SREM', KEYS[4], ARGV[1])
return 1
