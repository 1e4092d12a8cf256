-- dispatch(rev, worker, reply, max_jobs, n, trace, ring, key1, payload1, request1, …)
--   -> {answer1, …, answerN}, each {'sent', token} | {'queued'} |
--      {'exists', state} | {'full'}; or {{'stale', rev}}: none was dispatched
--
-- KEYS[1] jobs hash   KEYS[2] slot table (rmap hash)   KEYS[3] token counter
-- KEYS[4] queued set  KEYS[5] the worker's inbox       KEYS[6] the worker's job set
-- KEYS[6 + i] job i's record
-- ARGV[1] slot table revision the caller routed with  ARGV[2] worker every
-- job routes to ('' when there are no slots: queue)  ARGV[3] reply stream
-- ARGV[4] max jobs in the pool (0: no limit)  ARGV[5] n  ARGV[6] the
-- dispatcher's W3C traceparent ('' when it does not trace)  ARGV[7] '1'
-- to ring the inbox's doorbell (see `ring`)  then each job's key, payload
-- and request id
--
-- Why a script: for each job, the checks (membership unchanged, key free,
-- room in the pool), the token, the ownership, the record and the start
-- event for the worker must be one step, or two dispatchers could both
-- start a key, or a start could reach a worker that no longer owns the
-- slot. A single dispatch sends one job; a batch, the jobs that route to
-- one worker, which share the script's set-up and the revision check. Each
-- job is claimed after the one before it, so its answer is the one it
-- would have had alone in its place.
local jobs = KEYS[1]
local rev = redis.call('HGET', KEYS[2], '=rev') or '0'
if rev ~= ARGV[1] then return {{'stale', rev}} end
local worker, reply = ARGV[2], ARGV[3]
local max_jobs, n, trace = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6]
local state = worker == '' and 'queued' or 'running'
-- The jobs' tokens at once, in job order (a job not claimed leaves its
-- token unused: tokens only have to grow), and their keys added to the
-- queued set or the worker's set at once, after the loop.
local first = take_tokens(KEYS[3], n) - n
-- What every job's start event shares, made once: its fields but key,
-- token, request and payload (seq 0, reply stream | attempt 1, not
-- requeued, created at the event's time | no state, the dispatch's trace).
-- Numbers become text with '%d': `tostring` prints a double. The fixed
-- fields are written out (`1:0,` is ns('0')), and the ownership's seq is
-- the text '0': each `ns` of a new length, and each number made text,
-- formats a number, the costliest step of a field.
local after_token = '1:0,' .. ns(reply)
local after_request = '1:1,1:0,0:,'
local after_payload = '1:0,0:,' .. ns(trace)
-- A traced job keeps its dispatch's traceparent in its record: a later
-- start (after a move or a wait in the queue) continues that trace, and
-- notifications link to it. An untraced one writes nothing more.
local function keep(record, payload, created)
  if trace == '' then
    redis.call('HSET', record, 'payload', payload, 'created', created, 'attempt', '1')
  else
    redis.call('HSET', record, 'payload', payload, 'created', created, 'attempt', '1', 'trace', trace)
  end
end
local answers, claimed, rings = {}, {}, {}
local prev = ARGV[7] == '1' and worker ~= '' and last_id(KEYS[5])
for i = 1, n do
  local key, payload, request = ARGV[5 + 3 * i], ARGV[6 + 3 * i], ARGV[7 + 3 * i]
  local record = KEYS[6 + i]
  local token = string.format('%d', first + i)
  if redis.call('HSETNX', jobs, key, ownership(state, worker, token, '0')) == 0 then
    answers[i] = {'exists', parse(redis.call('HGET', jobs, key)).state}
  elseif max_jobs > 0 and redis.call('HLEN', jobs) > max_jobs then
    redis.call('HDEL', jobs, key)
    answers[i] = {'full'}
  elseif worker == '' then
    keep(record, payload, now_ms())
    claimed[#claimed + 1] = key
    answers[i] = {'queued'}
  else
    -- The start event: key, token, seq, reply stream, request, attempt,
    -- requeued, created ('' = the event's own time), payload, has state,
    -- state, trace.
    -- (One concatenation: each `..` of a separate `ns` would make a string.)
    local event = ns_head(#key) .. key .. ',' .. ns_head(#token) .. token .. ',' .. after_token
      .. ns_head(#request) .. request .. ',' .. after_request .. ns_head(#payload) .. payload .. ','
      .. after_payload
    local id = redis.call('XADD', KEYS[5], '*', 'n', 'start', 'p', event)
    if prev then rings[#rings + 1] = rung(id, 'start', event) end
    keep(record, payload, string.match(id, '^(%d+)'))
    claimed[#claimed + 1] = key
    answers[i] = {'sent', token}
  end
end
if #claimed > 0 then redis.call('SADD', worker == '' and KEYS[4] or KEYS[6], unpack(claimed)) end
if #rings > 0 then ring(KEYS[5], prev, rings) end
return answers
