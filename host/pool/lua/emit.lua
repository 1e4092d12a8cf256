-- emit(key, token, payload, max_len) -> the event id, or '' when the token
-- is not the job's.
--
-- KEYS[1] jobs hash   KEYS[2] the pool's events stream
-- ARGV[1] key  ARGV[2] token  ARGV[3] payload  ARGV[4] entries the events
-- stream keeps (its retention; older outputs are trimmed)
--
-- Fenced by the token in one step: a worker that lost the job emits
-- nothing in its name.
local job = parse(redis.call('HGET', KEYS[1], ARGV[1]))
if not job or job.token ~= ARGV[2] or (job.state ~= 'running' and job.state ~= 'moving') then return '' end
return redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 'n', 'emit', 'p', ARGV[3], 't', ARGV[1])
