-- assign(key, rev, worker, ring) -> {'sent', token} | {'stale', rev} | {'skip'}
--
-- KEYS[1] jobs hash       KEYS[2] the job's record   KEYS[3] slot table
-- KEYS[4] token counter   KEYS[5] queued set          KEYS[6] the worker's inbox
-- KEYS[7] the worker's job set                        KEYS[8] the job's held events
-- KEYS[9] the pool's shutdown flag
-- ARGV[1] key  ARGV[2] slot table revision  ARGV[3] worker
-- ARGV[4] '1' to ring the inbox's doorbell (see `ring`)
--
-- Starts a queued job on `worker`: a new token, then the start event and,
-- in order behind it, every event held while the job waited. Atomic, so no
-- stop or notify can slip between the start and the held events. Once the
-- pool shuts down no job starts anywhere: the job stays queued until the
-- pool's keys are removed.
local jobs, record, held = KEYS[1], KEYS[2], KEYS[8]
local key, worker = ARGV[1], ARGV[3]
if redis.call('EXISTS', KEYS[9]) == 1 then return {'skip'} end
local rev = redis.call('HGET', KEYS[3], '=rev') or '0'
if rev ~= ARGV[2] then return {'stale', rev} end
local job = parse(redis.call('HGET', jobs, key))
if not job or job.state ~= 'queued' then
  redis.call('SREM', KEYS[5], key)
  return {'skip'}
end
local token = string.format('%d', take_tokens(KEYS[4], 1))
-- `reply` and `request`: a dispatcher still waiting for the start, when
-- the job's first worker was evicted before it started it.
-- `trace`: the traceparent of the dispatch, when it was traced.
local r = redis.call('HMGET', record, 'payload', 'created', 'attempt', 'state', 'requeued', 'reply', 'request', 'trace')
local has_state = r[4] and '1' or '0'
local start = ns(key) .. ns(token) .. ns('0') .. ns(r[6] or '') .. ns(r[7] or '') .. ns(r[3] or '1')
  .. ns(r[5] or '0') .. ns(r[2] or '') .. ns(r[1] or '') .. ns(has_state) .. ns(r[4] or '') .. ns(r[8] or '')
local ringing, rings = ARGV[4] == '1', {}
local prev = ringing and last_id(KEYS[6])
local id = redis.call('XADD', KEYS[6], '*', 'n', 'start', 'p', start)
if ringing then rings[1] = rung(id, 'start', start) end
note(record, 'started', worker)
if r[6] then redis.call('HDEL', record, 'reply', 'request') end
local seq = job.seq
for _, held_entry in ipairs(redis.call('LRANGE', held, 0, -1)) do
  -- A held event goes out like a live one, numbered after the last sent.
  local event = netstrings(held_entry)
  if event and #event == 4 then
    seq = seq + 1
    local p = ns(key) .. ns(token) .. ns(tostring(seq)) .. ns(event[2]) .. ns(event[3])
    if event[1] == 'notify' then p = p .. ns(event[4]) end
    id = redis.call('XADD', KEYS[6], '*', 'n', event[1], 'p', p)
    if ringing then rings[#rings + 1] = rung(id, event[1], p) end
  end
end
redis.call('DEL', held)
if ringing then ring(KEYS[6], prev, rings) end
redis.call('HSET', jobs, key, ownership('running', worker, token, seq))
redis.call('SREM', KEYS[5], key)
redis.call('SADD', KEYS[7], key)
return {'sent', token}
