-- dispatch(rev, max_jobs, n, trace, ring, w, worker1, reply1, …, workerW,
--          replyW, job1's worker number, key1, payload1, request1, …)
--   -> {answer1, …, answerN}, each {'sent', token} | {'queued'} |
--      {'exists', state} | {'full'}; or {{'stale', rev}}: none was dispatched
--
-- KEYS[1] jobs hash   KEYS[2] slot table (rmap hash)   KEYS[3] token counter
-- KEYS[4] queued set  KEYS[3 + 2j] worker j's inbox  KEYS[4 + 2j] its job set
-- KEYS[4 + 2W + i] job i's record
-- ARGV[1] slot table revision the caller routed with  ARGV[2] max jobs in
-- the pool (0: no limit)  ARGV[3] n  ARGV[4] the dispatcher's W3C
-- traceparent ('' when it does not trace)  ARGV[5] '1' to ring the inboxes'
-- doorbells (see `ring`)  ARGV[6] W, then each worker (its id, '' when
-- there are no slots: queue) and the stream its answers go to, then each
-- job's worker (its number among them, from 1), key, payload and request id
--
-- Why a script: for each job, the checks (membership unchanged, key free,
-- room in the pool), the token, the ownership, the record and the start
-- event for the worker must be one step, or two dispatchers could both
-- start a key, or a start could reach a worker that no longer owns the
-- slot. A single dispatch sends one job; dispatches that set out together
-- and a batch send several, to any workers of the slot group, and share
-- the script's set-up and the revision check. Each job is claimed after
-- the one before it, so its answer is the one it would have had alone in
-- its place.
local jobs = KEYS[1]
local rev = redis.call('HGET', KEYS[2], '=rev') or '0'
if rev ~= ARGV[1] then return {{'stale', rev}} end
local max_jobs, n, trace = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local ringing, w = ARGV[5] == '1', tonumber(ARGV[6])
local at = 6 + 2 * w -- job i's worker number is ARGV[at + 4i - 3]
-- The jobs' tokens at once, in job order (a job not claimed leaves its
-- token unused: tokens only have to grow), and each worker's keys added
-- to its job set (or the queued set) at once, after the loop.
local first = take_tokens(KEYS[3], n) - n
-- What every job's start event shares, made once: its fields but key,
-- token, reply stream, request and payload (seq 0 | attempt 1, not
-- requeued, created at the event's time | no state, the dispatch's
-- trace). Numbers become text with '%d': `tostring` prints a double. The
-- fixed fields are written out (`1:0,` is ns('0')), and the ownership's
-- seq is the text '0': each `ns` of a new length, and each number made
-- text, formats a number, the costliest step of a field.
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
-- Per worker, made at its first job: what its starts share after the
-- token (`1:0,` and its reply stream), the id its inbox ended at before
-- this script (when ringing), its entries to ring and its jobs claimed.
local after_token, prevs, rings, claimed = {}, {}, {}, {}
local answers = {}
for i = 1, n do
  local j = tonumber(ARGV[at + 4 * i - 3])
  local key, payload, request = ARGV[at + 4 * i - 2], ARGV[at + 4 * i - 1], ARGV[at + 4 * i]
  local worker = ARGV[5 + 2 * j]
  local record = KEYS[4 + 2 * w + i]
  local token = string.format('%d', first + i)
  if redis.call('HSETNX', jobs, key, ownership(worker == '' and 'queued' or 'running', worker, token, '0')) == 0 then
    answers[i] = {'exists', parse(redis.call('HGET', jobs, key)).state}
  elseif max_jobs > 0 and redis.call('HLEN', jobs) > max_jobs then
    redis.call('HDEL', jobs, key)
    answers[i] = {'full'}
  else
    if not claimed[j] then
      claimed[j], after_token[j] = {}, '1:0,' .. ns(ARGV[6 + 2 * j])
      prevs[j] = ringing and worker ~= '' and last_id(KEYS[3 + 2 * j])
      rings[j] = {}
    end
    local mine = claimed[j]
    mine[#mine + 1] = key
    if worker == '' then
      keep(record, payload, now_ms())
      answers[i] = {'queued'}
    else
      -- The start event: key, token, seq, reply stream, request, attempt,
      -- requeued, created ('' = the event's own time), payload, has state,
      -- state, trace.
      -- (One concatenation: each `..` of a separate `ns` would make a string.)
      local event = ns_head(#key) .. key .. ',' .. ns_head(#token) .. token .. ',' .. after_token[j]
        .. ns_head(#request) .. request .. ',' .. after_request .. ns_head(#payload) .. payload .. ','
        .. after_payload
      local id = redis.call('XADD', KEYS[3 + 2 * j], '*', 'n', 'start', 'p', event)
      if prevs[j] then rings[j][#rings[j] + 1] = rung(id, 'start', event) end
      keep(record, payload, string.match(id, '^(%d+)'))
      answers[i] = {'sent', token}
    end
  end
end
for j = 1, w do
  local mine = claimed[j]
  if mine then
    redis.call('SADD', ARGV[5 + 2 * j] == '' and KEYS[4] or KEYS[4 + 2 * j], unpack(mine))
    if #rings[j] > 0 then ring(KEYS[3 + 2 * j], prevs[j], rings[j]) end
  end
end
return answers
