-- Shared head of the pool's scripts (scripts.rs prepends it).
--
-- A job's ownership is one field of the jobs hash, key -> value:
--   state|worker|token|seq
-- state: running, moving (its worker is handing it back), queued or failed; worker: its owner when running;
-- token: the fencing token of its current ownership (grows forever, pool
-- wide); seq: the sequence number of the last event sent for it.
-- Every change a worker makes to a job passes the token it holds; a script
-- refuses it when the token is no longer the job's.

local function ns(s)
  return #s .. ':' .. s .. ','
end

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
