-- mark_moving(key, token) -> the id of the last entry of the worker's inbox
-- ('0-0' when empty), or '' when the token is not the job's.
--
-- KEYS[1] jobs hash   KEYS[2] the worker's inbox
-- ARGV[1] key  ARGV[2] the token the worker holds
--
-- The first step of handing a job back: from now on its stops and
-- notifications are held (route.lua), and everything sent before is in the
-- inbox up to the returned id, which the worker processes before it stops
-- the job. One step, so no event falls between "sent" and "held".
local job = parse(redis.call('HGET', KEYS[1], ARGV[1]))
if not job or job.token ~= ARGV[2] or job.state ~= 'running' then return '' end
redis.call('HSET', KEYS[1], ARGV[1], ownership('moving', job.worker, job.token, job.seq))
local last = redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)[1]
return last and last[1] or '0-0'
