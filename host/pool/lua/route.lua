-- route(kind, key, worker, reply, request, payload, trace, ring)
--   -> {'sent'} | {'held'} | {'stopped'} | {'missing'} | {'failed', reason} | {'owner', worker}
--
-- KEYS[1] jobs hash   KEYS[2] the job's record   KEYS[3] the job's held events
-- KEYS[4] the inbox of the worker the caller expects to own the job
-- KEYS[5] queued set
-- ARGV[1] `stop` or `notify`  ARGV[2] key  ARGV[3] the expected owner
-- ARGV[4] reply stream  ARGV[5] request id  ARGV[6] payload (notify)
-- ARGV[7] the sender's W3C traceparent ('' when it does not trace)
-- ARGV[8] '1' to ring the inbox's doorbell (see `ring`)
--
-- A job that is `moving` (its worker is handing it back) or `queued` has
-- its events held.
--
-- Sends a stop or notification to the job's owner with the next sequence
-- number, or, when the job waits for a worker, holds it in order to be
-- delivered after its start. A stop of a job that waits, with nothing held
-- before it, is immediate. Atomic, so an event is never routed to an owner that
-- changed in between, and never lost between "held" and "sent".
local jobs, record, held = KEYS[1], KEYS[2], KEYS[3]
local kind, key = ARGV[1], ARGV[2]
local job = parse(redis.call('HGET', jobs, key))
if not job then return {'missing'} end
if job.state == 'failed' then
  return {'failed', redis.call('HGET', record, 'reason') or ''}
end
if job.state == 'moving' then
  -- Leaving its worker: held, in order, for after its next start.
  redis.call('RPUSH', held, held_event(kind, '', '', ARGV[6]))
  return {'held'}
end
if job.state == 'queued' then
  -- A stop of a waiting job is immediate unless events wait before it:
  -- then it waits too, so they reach the handler first (start, the
  -- events, then the stop, as they were sent).
  if kind == 'stop' and redis.call('LLEN', held) == 0 then
    redis.call('HDEL', jobs, key)
    redis.call('DEL', record, held)
    redis.call('SREM', KEYS[5], key)
    return {'stopped'}
  end
  redis.call('RPUSH', held, held_event(kind, '', '', ARGV[6]))
  return {'held'}
end
if job.worker ~= ARGV[3] then return {'owner', job.worker} end
local seq = job.seq + 1
local p = ns(key) .. ns(job.token) .. ns(tostring(seq)) .. ns(ARGV[4]) .. ns(ARGV[5])
if kind == 'notify' then
  p = p .. ns(ARGV[6])
  -- A traced notification carries its sender's trace and the one that
  -- started the job, which its span links to (read only when traced).
  if ARGV[7] ~= '' then p = p .. ns(ARGV[7]) .. ns(redis.call('HGET', record, 'trace') or '') end
end
local prev = ARGV[8] == '1' and last_id(KEYS[4])
local id = redis.call('XADD', KEYS[4], '*', 'n', kind, 'p', p)
if prev then ring(KEYS[4], prev, {rung(id, kind, p)}) end
redis.call('HSET', jobs, key, ownership(job.state, job.worker, job.token, seq))
return {'sent'}
