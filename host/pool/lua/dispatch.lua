-- dispatch(key, payload, rev, worker, reply, request, max_jobs)
--   -> {'sent', token} | {'queued'} | {'exists', state} | {'full'} | {'stale', rev}
--
-- KEYS[1] jobs hash        KEYS[2] the job's record   KEYS[3] slot table (rmap hash)
-- KEYS[4] token counter    KEYS[5] queued set          KEYS[6] the worker's inbox
-- KEYS[7] the worker's job set
-- ARGV[1] key  ARGV[2] payload  ARGV[3] slot table revision the caller routed with
-- ARGV[4] worker chosen ('' when there are no slots: queue)  ARGV[5] reply stream
-- ARGV[6] request id  ARGV[7] max jobs in the pool (0: no limit)
--
-- Why a script: the checks (membership unchanged, key free, room in the
-- pool), the token, the ownership, the record and the start event for the
-- worker must be one step, or two dispatchers could both start a key, or
-- a start could reach a worker that no longer owns the slot.
local jobs, record = KEYS[1], KEYS[2]
local key, payload = ARGV[1], ARGV[2]
local rev = redis.call('HGET', KEYS[3], '=rev') or '0'
if rev ~= ARGV[3] then return {'stale', rev} end
local token = tostring(redis.call('INCR', KEYS[4]))
local worker = ARGV[4]
local state = worker == '' and 'queued' or 'running'
if redis.call('HSETNX', jobs, key, ownership(state, worker, token, 0)) == 0 then
  return {'exists', parse(redis.call('HGET', jobs, key)).state}
end
local max_jobs = tonumber(ARGV[7])
if max_jobs > 0 and redis.call('HLEN', jobs) > max_jobs then
  redis.call('HDEL', jobs, key)
  return {'full'}
end
if worker == '' then
  redis.call('HSET', record, 'payload', payload, 'created', now_ms(), 'attempt', 1)
  redis.call('SADD', KEYS[5], key)
  return {'queued'}
end
local event = first_start(key, token, ARGV[5], ARGV[6], payload)
local id = redis.call('XADD', KEYS[6], '*', 'n', 'start', 'p', event)
redis.call('HSET', record, 'payload', payload, 'created', string.match(id, '^(%d+)'), 'attempt', 1)
redis.call('SADD', KEYS[7], key)
return {'sent', token}
