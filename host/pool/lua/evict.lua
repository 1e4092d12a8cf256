-- evict(grace, forced, n, worker1, jobs1, ..., key1, key2, ...)
--   -> {worker, jobs queued, worker, jobs queued, ...} | {'changed'}
--
-- KEYS[1] slot table   KEYS[2] workers map   KEYS[3] leases
-- KEYS[4] jobs hash    KEYS[5] queued set
-- then for worker i (1..n): KEYS[4 + 2i] its inbox, KEYS[5 + 2i] its job set
-- then for each job key j, in ARGV's order: KEYS[4 + 2n + 2j] its record,
-- KEYS[5 + 2n + 2j] its held events
-- ARGV[1] slot table channel  ARGV[2] workers map channel
-- ARGV[3] epoch for a map that has none  ARGV[4] grace in ms
-- ARGV[5] '1': evict the workers whatever their leases (they fenced
-- themselves); '': the workers must be every worker whose lease ended more
-- than the grace ago (expired.lua), and only those are evicted
-- ARGV[6] n, then each worker and the number of its jobs, then the keys
-- of every worker's jobs, worker after worker
--
-- Why the caller names every key: a script that builds keys itself touches
-- keys Redis Cluster never checked, which read as nil, without an error,
-- while their slot migrates. The caller read the job sets before this
-- runs, so a set that gained a job since (one assigned to the worker) or a
-- worker expired since answers 'changed' and nothing is written: the
-- caller reads again.
--
-- Evicts the workers in one step: their slots move to live workers only
-- (give_up_slots), so none passes from one evicted worker to another;
-- their entries, leases, job sets and inboxes go; each job a worker owned
-- is queued for its next worker with the unprocessed entries of the inbox
-- (a worker deletes each entry it processed) moved, in order and ahead of
-- anything held since, into the job's held events.
local slots = {hash = KEYS[1], channel = ARGV[1], epoch = ARGV[3]}
local workers = {hash = KEYS[2], channel = ARGV[2], epoch = ARGV[3]}
local leases, jobs, queued = KEYS[3], KEYS[4], KEYS[5]
local forced, n = ARGV[5] == '1', tonumber(ARGV[6])

-- The workers as named, each with its keys and its jobs' keys.
local named, by_worker, j = {}, {}, 0
for i = 1, n do
  local w = {id = ARGV[5 + 2 * i], inbox = KEYS[4 + 2 * i], set = KEYS[5 + 2 * i], jobs = {}}
  for _ = 1, tonumber(ARGV[6 + 2 * i]) do
    j = j + 1
    local key = ARGV[6 + 2 * n + j]
    table.insert(w.jobs, {key = key, record = KEYS[4 + 2 * n + 2 * j], held = KEYS[5 + 2 * n + 2 * j]})
  end
  table.insert(named, w)
  by_worker[w.id] = true
end

-- Every check before the first write.
local leaving = {}
if forced then
  leaving = named
else
  -- A named worker no longer expired was evicted meanwhile by another
  -- node's janitor (or renewed): it stays as it is.
  local now, grace = tonumber(now_ms()), tonumber(ARGV[4])
  local expired = {}
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', leases, '-inf', now - grace)) do
    if not by_worker[id] then return {'changed'} end
    expired[id] = true
  end
  for _, w in ipairs(named) do
    if expired[w.id] then table.insert(leaving, w) end
  end
end
-- A job that left a set since (handed back, finished) is harmless: each
-- named job's ownership is checked again below. One that joined it (a job
-- assigned to the worker meanwhile) has keys nobody named.
for _, w in ipairs(leaving) do
  local named_jobs = {}
  for _, job in ipairs(w.jobs) do named_jobs[job.key] = true end
  for _, key in ipairs(redis.call('SMEMBERS', w.set)) do
    if not named_jobs[key] then return {'changed'} end
  end
end

-- The fields of a stream entry: kind and payload.
local function entry_fields(entry)
  local kind, payload
  local f = entry[2]
  for i = 1, #f, 2 do
    if f[i] == 'n' then kind = f[i + 1] elseif f[i] == 'p' then payload = f[i + 1] end
  end
  return kind, payload
end

local function evict(w)
  rmap_del(workers, w.id)
  redis.call('ZREM', leases, w.id)
  -- The unprocessed tail, for jobs still the worker's (same token): the
  -- starts it never ran, and the stops and notifications per key.
  local unstarted, tail = {}, {}
  for _, entry in ipairs(redis.call('XRANGE', w.inbox, '-', '+')) do
    local kind, payload = entry_fields(entry)
    local f = netstrings(payload)
    if kind and f and #f >= 5 then
      local key = f[1]
      local job = parse(redis.call('HGET', jobs, key))
      if job and job.token == f[2] and job.worker == w.id then
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
  for _, j in ipairs(w.jobs) do
    local key = j.key
    local job = parse(redis.call('HGET', jobs, key))
    if job and job.worker == w.id and (job.state == 'running' or job.state == 'moving') then
      local seq = job.seq
      local events = tail[key]
      if events then
        -- Ahead of what was held since, numbered again from the first.
        seq = events[1].seq - 1
        for i = #events, 1, -1 do
          local e = events[i]
          redis.call('LPUSH', j.held, held_event(e.kind, e.reply, e.request, e.payload))
        end
      end
      if unstarted[key] then
        -- Never started here: whoever waits for the start hears from the next worker.
        redis.call('HSET', j.record, 'reply', unstarted[key][1], 'request', unstarted[key][2])
      else
        redis.call('HSET', j.record, 'requeued', '1')
      end
      redis.call('HSET', jobs, key, ownership('queued', '', job.token, seq))
      note(j.record, 'evicted', w.id)
      redis.call('SADD', queued, key)
      moved = moved + 1
    end
  end
  redis.call('DEL', w.inbox, w.set)
  return moved
end

local leavers = {}
for _, w in ipairs(leaving) do leavers[w.id] = true end
give_up_slots(slots, leavers, leases)
local out = {}
for _, w in ipairs(leaving) do
  table.insert(out, w.id)
  table.insert(out, evict(w))
end
return out
