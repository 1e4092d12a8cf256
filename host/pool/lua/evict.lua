-- evict(grace, worker) -> {worker, jobs queued, worker, jobs queued, ...
--                          [, 'next', ms]}
--
-- KEYS[1] slot table   KEYS[2] workers map   KEYS[3] leases
-- KEYS[4] jobs hash    KEYS[5] queued set
-- ARGV[1] slot table channel  ARGV[2] workers map channel
-- ARGV[3] epoch for a map that has none
-- ARGV[4] the pool's key prefix, `pulse:{pool}:`
-- ARGV[5] the prefix of inbox keys (an inbox is the prefix and the worker)
-- ARGV[6] grace in ms  ARGV[7] a worker to evict whatever its lease (a
-- worker that fenced itself), or '' for every worker whose lease expired
-- more than the grace ago (at most 16 per call)
--
-- Evicts a worker in one step: its slots (to the least loaded of the
-- workers that stay), its entry and its lease go; each job it owned is queued for its next worker with the
-- unprocessed entries of the inbox (a worker deletes each entry it processed)
-- moved, in order and ahead of anything held since, into the job's held
-- events. The expiry is checked here, on Redis time: eviction needs the
-- lease expired by more than the grace, by which time the worker fenced
-- itself (it stops its jobs before its lease ends). Evicting every expired
-- worker also answers when the next one may be evicted ('next', in ms from
-- now: the earliest lease's end plus the grace), so the janitor can wake
-- then rather than at its next tick.
local slots = {hash = KEYS[1], channel = ARGV[1], epoch = ARGV[3]}
local workers = {hash = KEYS[2], channel = ARGV[2], epoch = ARGV[3]}
local leases, jobs, queued = KEYS[3], KEYS[4], KEYS[5]
local prefix, inboxes = ARGV[4], ARGV[5]

-- The fields of a stream entry: kind and payload.
local function entry_fields(entry)
  local kind, payload
  local f = entry[2]
  for i = 1, #f, 2 do
    if f[i] == 'n' then kind = f[i + 1] elseif f[i] == 'p' then payload = f[i + 1] end
  end
  return kind, payload
end

local function evict(worker)
  rmap_del(workers, worker)
  redis.call('ZREM', leases, worker)
  local inbox = inboxes .. worker
  local worker_jobs = prefix .. 'worker:' .. worker .. ':jobs'
  -- The unprocessed tail, for jobs still the worker's (same token): the
  -- starts it never ran, and the stops and notifications per key.
  local unstarted, tail = {}, {}
  for _, entry in ipairs(redis.call('XRANGE', inbox, '-', '+')) do
    local kind, payload = entry_fields(entry)
    local f = netstrings(payload)
    if kind and f and #f >= 5 then
      local key = f[1]
      local job = parse(redis.call('HGET', jobs, key))
      if job and job.token == f[2] and job.worker == worker then
        if kind == 'start' then
          unstarted[key] = {f[4], f[5]}
        else
          tail[key] = tail[key] or {}
          table.insert(tail[key], {kind = kind, seq = tonumber(f[3]), reply = f[4], request = f[5], payload = f[6] or ''})
        end
      end
    end
  end
  local moved = 0
  for _, key in ipairs(redis.call('SMEMBERS', worker_jobs)) do
    local job = parse(redis.call('HGET', jobs, key))
    if job and job.worker == worker and (job.state == 'running' or job.state == 'moving') then
      local seq = job.seq
      local events = tail[key]
      if events then
        -- Ahead of what was held since, numbered again from the first.
        seq = events[1].seq - 1
        for i = #events, 1, -1 do
          local e = events[i]
          redis.call('LPUSH', prefix .. 'held:' .. key, held_event(e.kind, e.reply, e.request, e.payload))
        end
      end
      local record = prefix .. 'job:' .. key
      if unstarted[key] then
        -- Never started here: whoever waits for the start hears from the next worker.
        redis.call('HSET', record, 'reply', unstarted[key][1], 'request', unstarted[key][2])
      else
        redis.call('HSET', record, 'requeued', '1')
      end
      redis.call('HSET', jobs, key, ownership('queued', '', job.token, seq))
      redis.call('SADD', queued, key)
      moved = moved + 1
    end
  end
  redis.call('DEL', inbox, worker_jobs)
  return moved
end

local out = {}
if ARGV[7] ~= '' then
  give_up_slots(slots, {[ARGV[7]] = true})
  table.insert(out, ARGV[7])
  table.insert(out, evict(ARGV[7]))
  return out
end
local now, grace = tonumber(now_ms()), tonumber(ARGV[6])
local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now - grace, 'LIMIT', 0, 16)
-- The slots of every worker evicted now move in one step, so none passes
-- to another worker evicted in the same breath (a dead host's workers
-- expire together).
local leavers = {}
for _, worker in ipairs(expired) do
  leavers[worker] = true
end
give_up_slots(slots, leavers)
for _, worker in ipairs(expired) do
  table.insert(out, worker)
  table.insert(out, evict(worker))
end
local earliest = redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')
if earliest[2] then
  table.insert(out, 'next')
  table.insert(out, math.max(0, tonumber(earliest[2]) + grace - now))
end
return out
