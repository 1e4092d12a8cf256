-- Shared head of the pool's scripts (scripts.rs prepends it, after the
-- replicated map library, pulse_rmap::SCRIPT_LIBRARY, which brings `ns`,
-- `netstrings` and the writes of the slot table and workers maps).
--
-- A job's ownership is one field of the jobs hash, key -> value:
--   state|worker|token|seq
-- state: running, moving (its worker is handing it back), queued or failed; worker: its owner when running;
-- token: the fencing token of its current ownership (grows forever, pool
-- wide); seq: the sequence number of the last event sent for it.
-- Every change a worker makes to a job passes the token it holds; a script
-- refuses it when the token is no longer the job's.

local function parse(value)
  if not value then return nil end
  local state, worker, token, seq = string.match(value, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
  return {state = state, worker = worker, token = token, seq = tonumber(seq)}
end

local function ownership(state, worker, token, seq)
  return state .. '|' .. worker .. '|' .. token .. '|' .. tostring(seq)
end

-- The milliseconds of Redis's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tostring(tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
end

-- A held event, waiting in a job's held list for the job's next start:
-- kind (`stop` or `notify`), where to answer (reply stream and request id,
-- empty when nobody waits), payload.
local function held_event(kind, reply, request, payload)
  return ns(kind) .. ns(reply) .. ns(request) .. ns(payload)
end

-- Swap-removes `worker`'s slot from the slot table: the last slot's worker
-- takes it and the table shrinks by one, so Jump Consistent Hash moves the
-- keys of two slots, not of every slot after it. False when it holds none.
local function swap_remove(slots, worker)
  local entries = rmap_entries(slots)
  local count, index = 0, nil
  for slot, w in pairs(entries) do
    count = count + 1
    if w == worker then index = slot end
  end
  if not index then return false end
  local last = tostring(count - 1)
  if index ~= last then rmap_set(slots, index, entries[last]) end
  rmap_del(slots, last)
  return true
end
