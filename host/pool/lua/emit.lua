-- emit(max_len, max_bytes, worker, key1, token1, payload1, …) -> flags: one
-- character per event, '1' when it was written, '0' when its token is not
-- its job's (or the job is not `worker`'s, running or moving).
--
-- KEYS[1] jobs hash   KEYS[2] the pool's events stream   KEYS[3] the
-- payload bytes ever written to the stream (a counter)   KEYS[4] the
-- payload bytes the stream held, as versions without `c` counted them
-- ARGV[1] entries the events stream keeps  ARGV[2] payload bytes it keeps
-- ARGV[3] the worker  then each event's job key, token and payload
--
-- Fenced by the token in one step: a worker that lost a job emits nothing
-- in its name. A worker sends the events its jobs emitted since its last
-- round trip in one call, in the order they were emitted.
--
-- Bounds: the stream never holds more than ARGV[2] payload bytes (but for
-- its newest entry, which always stays), nor more than ARGV[1] + 64
-- entries: one plugin emitting large events cannot fill Redis. Each entry
-- carries `c`, the counter after its payload: the bytes the stream holds
-- are the counter less the oldest entry's `c` less its payload, so a trim
-- by count is one XTRIM, without reading what it removes (reading an
-- entry into Lua costs twice what writing it does). The byte bound is
-- checked each time the counter passes a sixteenth of ARGV[2] (and with
-- each trim by count), and trims to fourteen sixteenths, so between two
-- checks the stream stays under ARGV[2].
--
-- Entries without `c` were written by an earlier version, which kept the
-- bytes the stream held in KEYS[4]: a new counter starts from there, so
-- those entries count as written before every entry with `c`, and a trim
-- that removes one counts its payload.
--
-- A call costs HMGET, an XADD per event, INCRBY and XLEN; one in about 64
-- entries, an XTRIM and a read of the oldest entry.
local n = (#ARGV - 3) / 3
local keys = {}
for i = 1, n do keys[i] = ARGV[1 + 3 * i] end
local owners = redis.call('HMGET', KEYS[1], unpack(keys))
-- An owner `state|worker|token|seq` is this worker's under this token
-- when `|worker|token|` follows `running` or `moving` (the only states
-- that start with `r` and `m`): a plain find, no captures.
local mine = '|' .. ARGV[3] .. '|'
local flags, added = {}, 0
for i = 1, n do
  local owner = owners[i]
  local at = owner and string.find(owner, mine .. ARGV[2 + 3 * i] .. '|', 1, true)
  if at and ((at == 8 and string.byte(owner, 1) == 114) or (at == 7 and string.byte(owner, 1) == 109)) then
    flags[i] = '1'
    added = added + #ARGV[3 + 3 * i]
  else
    flags[i] = '0'
  end
end
flags = table.concat(flags)
if not string.find(flags, '1', 1, true) then return flags end
local total = redis.call('INCRBY', KEYS[3], added)
if total == added then
  -- A new counter: what an earlier version's entries hold comes first.
  local earlier = tonumber(redis.call('GET', KEYS[4]) or 0) or 0
  if earlier > 0 then total = redis.call('INCRBY', KEYS[3], earlier) end
end
local counted = total - added
for i = 1, n do
  if string.byte(flags, i) == 49 then
    local payload = ARGV[3 + 3 * i]
    counted = counted + #payload
    redis.call('XADD', KEYS[2], '*', 'n', 'emit', 'p', payload, 't', ARGV[1 + 3 * i], 'c', string.format('%d', counted))
  end
end
local len = redis.call('XLEN', KEYS[2])
local max_len, max_bytes = tonumber(ARGV[1]), tonumber(ARGV[2])
local step = math.max(1, math.floor(max_bytes / 16))
if len <= max_len + 64 and math.floor(total / step) == math.floor((total - added) / step) then
  return flags
end

if len > max_len then
  redis.call('XTRIM', KEYS[2], 'MAXLEN', max_len)
  len = max_len
end
-- An entry's `c` (nil without one) and its payload's size.
local function counted_at(entry)
  local fields, at, size = entry[2], nil, 0
  for i = 1, #fields, 2 do
    if fields[i] == 'c' then
      at = tonumber(fields[i + 1])
    elseif fields[i] == 'p' then
      size = #fields[i + 1]
    end
  end
  return at, size
end
-- The bytes written before the oldest entry, that is trimmed already (0
-- before an entry without `c`: the counter began with those).
local batch = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
local trimmed = 0
if batch[1] then
  local at, size = counted_at(batch[1])
  if at then trimmed = at - size end
end
local keep_bytes = max_bytes - 2 * step
local last = nil
while len > 1 and total - trimmed > keep_bytes do
  batch = batch or redis.call('XRANGE', KEYS[2], '(' .. last, '+', 'COUNT', 64)
  if #batch == 0 then break end
  for _, entry in ipairs(batch) do
    if len <= 1 or total - trimmed <= keep_bytes then break end
    local at, size = counted_at(entry)
    trimmed = at or trimmed + size
    len = len - 1
    last = entry[1]
  end
  batch = nil
end
if last then
  -- Everything up to and including `last`: MINID keeps ids from the one after.
  local ms, seq = string.match(last, '^(%d+)-(%d+)$')
  redis.call('XTRIM', KEYS[2], 'MINID', ms .. '-' .. tostring(tonumber(seq) + 1))
end
return flags
