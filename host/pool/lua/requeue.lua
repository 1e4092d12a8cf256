-- requeue(key, token) -> 1, or 0 when the token is not the job's.
--
-- KEYS[1] jobs hash   KEYS[2] the job's record   KEYS[3] queued set
-- KEYS[4] the worker's job set
-- ARGV[1] key  ARGV[2] the token the worker holds
--
-- A worker that leaves hands a job it stopped back to the pool: the job
-- waits (its events are held meanwhile) until it is assigned to a worker,
-- which starts it with `requeued` set and the state it saved. Fenced by the
-- token, in one step.
local job = parse(redis.call('HGET', KEYS[1], ARGV[1]))
if not job or job.token ~= ARGV[2] or (job.state ~= 'running' and job.state ~= 'moving') then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ownership('queued', '', job.token, job.seq))
redis.call('HSET', KEYS[2], 'requeued', '1')
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[1])
return 1
