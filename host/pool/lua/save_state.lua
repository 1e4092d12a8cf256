-- save_state(key, token, state) -> 1, or 0 when the token is not the job's.
--
-- KEYS[1] jobs hash   KEYS[2] the job's record
-- ARGV[1] key  ARGV[2] token  ARGV[3] state
--
-- Fenced by the token in one step: a worker that lost the job cannot
-- overwrite the state its new owner starts from.
local job = parse(redis.call('HGET', KEYS[1], ARGV[1]))
if not job or job.token ~= ARGV[2] or (job.state ~= 'running' and job.state ~= 'moving') then return 0 end
redis.call('HSET', KEYS[2], 'state', ARGV[3])
return 1
