-- reassert(key, token, seq, payload, created, attempt, state, has state)
--   -> 1, or 0 when the key is taken
--
-- KEYS[1] jobs hash   KEYS[2] the job's record   KEYS[3] the worker's job set
-- KEYS[4] token counter
-- ARGV[1] key  ARGV[2] the token the worker holds  ARGV[3] the sequence
-- number of the last event it received  ARGV[4] worker  ARGV[5] payload
-- ARGV[6] created (ms)  ARGV[7] attempt  ARGV[8] the state the job saved
-- last, as its handler kept it  ARGV[9] '1' when it kept one
--
-- After Redis lost the pool's data, a worker writes back a job it still
-- runs, under the token it holds (so the job's context stays valid), unless
-- the key was dispatched anew meanwhile: then the new job wins and the
-- worker drops its run. The job's saved state comes back with it, in the
-- same step, so no start of the job can read the record without it. The token counter is raised past the token, so no
-- later token repeats it.
if redis.call('HSETNX', KEYS[1], ARGV[1], ownership('running', ARGV[4], ARGV[2], tonumber(ARGV[3]))) == 0 then
  return 0
end
redis.call('HSET', KEYS[2], 'payload', ARGV[5], 'created', ARGV[6], 'attempt', ARGV[7], 'requeued', '1')
if ARGV[9] == '1' then redis.call('HSET', KEYS[2], 'state', ARGV[8]) end
redis.call('SADD', KEYS[3], ARGV[1])
local current = tonumber(redis.call('GET', KEYS[4]) or '0')
if current < tonumber(ARGV[2]) then redis.call('SET', KEYS[4], ARGV[2]) end
return 1
