-- write(max_len, max_bytes, worker, replies_kept, items, answers,
--       kind1, key1, token1, payload1, …, stream_name1, payload1, …,
--       entry1, …) -> flags: one character per item, '1' when it was
--       written, '0' when its token is not its job's (or the job is not
--       `worker`'s, running or moving).
--
-- KEYS[1] jobs hash   KEYS[2] the pool's events stream   KEYS[3] the
-- payload bytes ever written to the stream (a counter)   KEYS[4] the
-- payload bytes the stream held, as versions without `c` counted them
-- KEYS[5] the worker's inbox   KEYS[6] the worker's job set
-- then for each item, in order: nothing for an event, the job's record for
-- a state, the job's record and held events for a finish; then each
-- answer's reply stream
-- ARGV[1] entries the events stream keeps  ARGV[2] payload bytes it keeps
-- ARGV[3] the worker  ARGV[4] entries a reply stream keeps (about)
-- ARGV[5] items  ARGV[6] answers  ARGV[7] '1' to ring the doorbells of
-- the reply streams answered (see `ring`)  then each item's kind (`e` an event
-- emitted, `s` a state saved, `f` the job finished), job key, token and
-- payload (empty for `f`); then each answer's entry name and payload; then
-- the inbox entries to delete
--
-- One step for everything a worker writes of its jobs' calls: the events
-- a call emitted, the state it saved and its job's completion land with
-- the answer to the call and the deletion of its inbox entry, or none of
-- them does. A host killed between two writes of one call could otherwise
-- leave a state saved without the event emitted with it: the job's next
-- run would resume past a count nobody saw. Each item is fenced by its
-- job's token: a worker that lost a job writes nothing in its name. A
-- finished job takes no later item of the same call.
--
-- Bounds of the events stream: it never holds more than ARGV[2] payload
-- bytes (but for its newest entry, which always stays), nor more than
-- ARGV[1] + 64 entries: one plugin emitting large events cannot fill
-- Redis. Each entry carries `c`, the counter after its payload: the bytes
-- the stream holds are the counter less the oldest entry's `c` less its
-- payload, so a trim by count is one XTRIM, without reading what it
-- removes (reading an entry into Lua costs twice what writing it does).
-- The byte bound is checked each time the counter passes a sixteenth of
-- ARGV[2] (and with each trim by count), and trims to fourteen sixteenths,
-- so between two checks the stream stays under ARGV[2].
--
-- Entries without `c` were written by an earlier version, which kept the
-- bytes the stream held in KEYS[4]: a new counter starts from there, so
-- those entries count as written before every entry with `c`, and a trim
-- that removes one counts its payload.
--
-- A call costs an HMGET per 1,000 items, an XADD per event, an HSET per
-- state, INCRBY and XLEN; one in about 64 entries, an XTRIM and a read of
-- the oldest entry; then an XADD per answer and one XDEL.
local n, answers = tonumber(ARGV[5]), tonumber(ARGV[6])
local function arg(i, field) return ARGV[3 + 4 * i + field] end -- field 1..4
local owners = {}
for first = 1, n, 1000 do
  local last = math.min(n, first + 999)
  local keys = {}
  for i = first, last do keys[#keys + 1] = arg(i, 2) end
  local got = redis.call('HMGET', KEYS[1], unpack(keys))
  for i = first, last do owners[i] = got[i - first + 1] end
end
-- An owner `state|worker|token|seq` is this worker's under this token
-- when `|worker|token|` follows `running` or `moving` (the only states
-- that start with `r` and `m`): a plain find, no captures.
local mine = '|' .. ARGV[3] .. '|'
local flags, added, finished = {}, 0, {}
for i = 1, n do
  local owner, key = owners[i], arg(i, 2)
  local at = owner and not finished[key] and string.find(owner, mine .. arg(i, 3) .. '|', 1, true)
  if at and ((at == 8 and string.byte(owner, 1) == 114) or (at == 7 and string.byte(owner, 1) == 109)) then
    flags[i] = '1'
    local kind = arg(i, 1)
    if kind == 'e' then added = added + #arg(i, 4)
    elseif kind == 'f' then finished[key] = true end
  else
    flags[i] = '0'
  end
end
flags = table.concat(flags)

-- States and finishes, each with its keys, in order.
local at_key = 7
for i = 1, n do
  local kind = arg(i, 1)
  if kind == 's' then
    if string.byte(flags, i) == 49 then redis.call('HSET', KEYS[at_key], 'state', arg(i, 4)) end
    at_key = at_key + 1
  elseif kind == 'f' then
    if string.byte(flags, i) == 49 then
      redis.call('HDEL', KEYS[1], arg(i, 2))
      redis.call('DEL', KEYS[at_key], KEYS[at_key + 1])
      redis.call('SREM', KEYS[6], arg(i, 2))
    end
    at_key = at_key + 2
  end
end

-- The answers and the inbox entries processed.
local at_arg = 8 + 4 * n
for a = 0, answers - 1 do
  local name, payload = ARGV[at_arg + 2 * a], ARGV[at_arg + 2 * a + 1]
  local prev = ARGV[7] == '1' and last_id(KEYS[at_key + a])
  local id = redis.call('XADD', KEYS[at_key + a], 'NOMKSTREAM', 'MAXLEN', '~', ARGV[4], '*', 'n', name, 'p', payload)
  -- A node that is gone has no stream, so nobody to ring.
  if id and prev then ring(KEYS[at_key + a], prev, {rung(id, name, payload)}) end
end
local deletes = {}
for i = at_arg + 2 * answers, #ARGV do deletes[#deletes + 1] = ARGV[i] end
if #deletes > 0 then redis.call('XDEL', KEYS[5], unpack(deletes)) end

if added == 0 then return flags end
local total = redis.call('INCRBY', KEYS[3], added)
if total == added then
  -- A new counter: what an earlier version's entries hold comes first.
  local earlier = tonumber(redis.call('GET', KEYS[4]) or 0) or 0
  if earlier > 0 then total = redis.call('INCRBY', KEYS[3], earlier) end
end
local counted = total - added
for i = 1, n do
  if string.byte(flags, i) == 49 and arg(i, 1) == 'e' then
    local payload = arg(i, 4)
    counted = counted + #payload
    redis.call('XADD', KEYS[2], '*', 'n', 'emit', 'p', payload, 't', arg(i, 2), 'c', string.format('%d', counted))
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
