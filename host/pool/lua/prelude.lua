-- Shared head of the pool's scripts (scripts.rs prepends it, after the
-- replicated map library, pulse_rmap::SCRIPT_LIBRARY, which brings `ns`,
-- `netstrings` and the writes of the slot table and workers maps).
--
-- A job's ownership is one field of the jobs hash, key -> value:
--   state|worker|token|seq
-- state: running, moving (its worker is handing it back), queued or failed; worker: its owner when running;
-- token: the fencing token of its current ownership (grows forever, pool
-- wide, see take_tokens); seq: the sequence number of the last event sent for it.
-- Every change a worker makes to a job passes the token it holds; a script
-- refuses it when the token is no longer the job's.

local function parse(value)
  if not value then return nil end
  local state, worker, token, seq = string.match(value, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
  return {state = state, worker = worker, token = token, seq = tonumber(seq)}
end

-- `seq` a number, or its text (a caller that has the text saves
-- formatting a number).
local function ownership(state, worker, token, seq)
  return state .. '|' .. worker .. '|' .. token .. '|' .. tostring(seq)
end

-- The milliseconds of Redis's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
end

-- Adds event `what` (one word: started, returned, evicted, failed,
-- retried) and the worker it concerns to the history of the job whose
-- record is `record`: lines of `<ms> <what> <worker>`, the newest last,
-- kept to its last 1 KiB, so a job that moves forever stays small.
-- For people (the API's job status, the status page, `status`): the pool
-- never reads it. Written where a job changes hands or fails, not by a
-- dispatch (the record's `created` is the first line).
local function note(record, what, worker)
  local limit = 1024
  local line = now_ms() .. ' ' .. what .. ' ' .. (worker or '') .. '\n'
  local history = (redis.call('HGET', record, 'history') or '') .. line
  if #history > limit then
    local cut = string.find(history, '\n', #history - limit, true)
    history = string.sub(history, cut + 1)
  end
  redis.call('HSET', record, 'history', history)
end

-- Takes `n` fencing tokens from the pool's counter (KEYS `counter`) and
-- returns the last of them. A counter Redis does not hold (a new pool, one
-- shut down, or one whose data Redis lost) starts at Redis's clock in
-- microseconds, not at 0: every token handed out before it was lost is then
-- smaller, so a service that keeps the newest token per job (docs/design.md,
-- "The fence carried to the world") never sees a job's token go back. That
-- holds while the pool hands out fewer than a million tokens a second on
-- average and Redis's clock does not go back. Costs one INCRBY, and TIME
-- and a second INCRBY once per counter.
local function take_tokens(counter, n)
  local last = redis.call('INCRBY', counter, n)
  if last > n then return last end
  local t = redis.call('TIME')
  return redis.call('INCRBY', counter, tonumber(t[1]) * 1000000 + tonumber(t[2]))
end

-- Rings the doorbell of `stream`: the id of the entry before the ones
-- added (`last_id`, taken before adding), then `entries` (what `rung` made
-- of each), on its shard channel of the same name, for a reader that
-- takes them from there instead of blocking in XREAD. Scripts ring when
-- their caller passes '1' (on a cluster with slot groups: pulse_redis's
-- doorbell.rs says why), in the step that adds the entries. The reader
-- takes the entries only when it has read up to the one before them: an
-- entry added by a writer that does not ring (a host of an earlier
-- version) is then read from the stream, never skipped.
local function ring(stream, prev, entries)
  redis.call('SPUBLISH', stream, ns(prev) .. table.concat(entries))
end

-- The id of the last entry `stream` holds, '0-0' when none.
local function last_id(stream)
  local last = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
  return last and last[1] or '0-0'
end

-- One entry of a ring: its id, name and payload, as the stream holds it.
local function rung(id, name, payload)
  return ns_head(#id) .. id .. ',' .. ns_head(#name) .. name .. ',' .. ns_head(#payload) .. payload .. ','
end

-- A held event, waiting in a job's held list for the job's next start:
-- kind (`stop` or `notify`), where to answer (reply stream and request id,
-- empty when nobody waits), payload.
local function held_event(kind, reply, request, payload)
  return ns(kind) .. ns(reply) .. ns(request) .. ns(payload)
end

-- The slot table: a fixed number of virtual slots (S, recorded in the
-- pool's epoch), each held by one worker: field = slot index, value =
-- worker. A key routes to slot JumpHash(CRC-64(key), S) and so to the
-- slot's worker. Membership changes move slots, never keys between slots:
-- a join takes slots from the most loaded workers, a leave gives the
-- leaver's slots to the least loaded, and no other slot changes hands,
-- so no survivor's job ever moves. Every change is one `mset` (or, when
-- the last holders leave, `reset`) of the replicated map: one revision.

-- The worker holding most (`most`) or fewest slots in `load` (worker ->
-- count); ties go to the first in `order`, so the choice is reproducible.
local function pick(load, order, most)
  local best
  for _, w in ipairs(order) do
    if not best or (most and load[w] > load[best]) or (not most and load[w] < load[best]) then
      best = w
    end
  end
  return best
end

-- The workers of `held` (worker -> its slots, or their number), sorted.
local function holders_of(held)
  local order = {}
  for w in pairs(held) do table.insert(order, w) end
  table.sort(order)
  return order
end

-- Gives `worker`, who holds no slot, every slot of `predecessor`. False
-- (and nothing changes) when `worker` holds slots already or
-- `predecessor` holds none.
local function inherit_slots(slots, worker, predecessor)
  local moves = {}
  for slot, w in pairs(rmap_entries(slots)) do
    if w == worker then return false end
    if w == predecessor then
      table.insert(moves, slot)
      table.insert(moves, worker)
    end
  end
  if #moves == 0 then return false end
  rmap_set_many(slots, moves)
  return true
end

-- Gives `worker`, who holds no slot, its share of the `count` slots: the
-- free slots and then slots of the most loaded workers, until it holds
-- floor(count / workers); every worker then holds that or one more.
-- Nothing changes when it holds slots already.
local function take_slots(slots, worker, count)
  local entries = rmap_entries(slots)
  local held, free = {}, {}
  for slot = 0, count - 1 do
    local w = entries[tostring(slot)]
    if w then
      held[w] = held[w] or {}
      table.insert(held[w], slot)
    else
      table.insert(free, slot)
    end
  end
  if held[worker] then return end
  local order = holders_of(held)
  local load = {}
  for _, w in ipairs(order) do load[w] = #held[w] end
  local target = math.floor(count / (#order + 1))
  local moves, taken = {}, 0
  -- Free slots (only an empty table has any): the joiner's first, any
  -- beyond its share to the least loaded.
  table.insert(order, worker)
  load[worker] = 0
  for i = #free, 1, -1 do
    local to = worker
    if taken >= target then to = pick(load, order, false) end
    load[to] = load[to] + 1
    if to == worker then taken = taken + 1 end
    table.insert(moves, tostring(free[i]))
    table.insert(moves, to)
  end
  table.remove(order)
  while taken < target do
    local from = pick(load, order, true)
    load[from] = load[from] - 1
    table.insert(moves, tostring(table.remove(held[from])))
    table.insert(moves, worker)
    taken = taken + 1
  end
  rmap_set_many(slots, moves)
end

-- Gives the slots of `leavers` (a set: worker -> true) to the least
-- loaded of the other holders whose leases (`leases`, worker -> deadline
-- in ms of Redis time) have not ended, one slot at a time. A holder whose
-- lease ended is dead or fenced and will be evicted: a slot given to it
-- would move again then, with the jobs routed to it meanwhile. Only when
-- every other holder's lease ended do they inherit (the slots move again
-- with them, rather than leave the pool without a holder); when no other
-- worker holds a slot, every slot is freed. Nothing else changes hands.
local function give_up_slots(slots, leavers, leases)
  if next(leavers) == nil then return end
  local orphaned, load = {}, {}
  for slot, w in pairs(rmap_entries(slots)) do
    if leavers[w] then
      table.insert(orphaned, tonumber(slot))
    else
      load[w] = (load[w] or 0) + 1
    end
  end
  if #orphaned == 0 then return end
  local order = holders_of(load)
  if #order == 0 then
    rmap_clear(slots)
    return
  end
  local now, live = tonumber(now_ms()), {}
  for _, w in ipairs(order) do
    local deadline = redis.call('ZSCORE', leases, w)
    if deadline and tonumber(deadline) > now then table.insert(live, w) end
  end
  if #live > 0 then order = live end
  table.sort(orphaned)
  local moves = {}
  for _, slot in ipairs(orphaned) do
    local to = pick(load, order, false)
    load[to] = load[to] + 1
    table.insert(moves, tostring(slot))
    table.insert(moves, to)
  end
  rmap_set_many(slots, moves)
end
