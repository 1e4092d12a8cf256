-- write(max_events, max_bytes, W, replies_kept, items, answers, ring,
--       B, batch1, …, count1, …, items1, …, kinds, key1, …, needle1, …,
--       state1, …, stream_name1, payload1, …, then per worker: deletes,
--       entry1, …) -> flags: one character per item, '1' when it was
--       written, '0' when its token is not its job's (or the job is not
--       its worker's, running or moving).
--
-- KEYS[1] jobs hash   KEYS[2] the pool's events stream   KEYS[3] the
-- bytes ever written to the stream (a counter)   KEYS[4] the payload
-- bytes the stream held, as versions without `c` counted them   KEYS[5]
-- the events ever written to the stream (a counter)
-- then each worker's inbox and job set: KEYS[4 + 2w] and KEYS[5 + 2w]
-- for worker w, 1 to W
-- then for each item, in order: nothing for an event, the job's record for
-- a state, the job's record and held events for a finish; then each
-- answer's reply stream
-- ARGV[1] events the events stream keeps  ARGV[2] bytes it keeps
-- ARGV[3] W, the workers whose writes these are  ARGV[4] entries a reply
-- stream keeps (about)  ARGV[5] items  ARGV[6] answers  ARGV[7] '1' to
-- ring the doorbells of the reply streams answered (see `ring`)
-- ARGV[8] B, then B batches of events (the netstrings of each event
-- item's job key and payload, in order, cut into entries as the bounds
-- below say), then how many events each batch holds
-- then how many items each worker has (the items are in the order of
-- the workers), then the items' kinds, one character each (`e` an event
-- emitted, `s` a state saved, `f` the job finished; empty when every item
-- is an event), then each item's job key, then each item's
-- `running|worker|token|` (the needle of the fence check, made by the
-- host), then the payload of each state; then each answer's entry name
-- and payload; then for each worker, how many of its inbox entries to
-- delete, and those entries
--
-- A host's workers of one slot group write together: one call carries
-- what each of them has ready when the call before it was answered (see
-- `core::flushes`). Most of a call's cost does not depend on how many
-- items it carries (the call, the counters, the events' entry), so the
-- more workers share one, the less each job pays.
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
-- The events of one call of this script share entries of the events
-- stream, up to 64 events and a sixteenth of ARGV[2] bytes to an entry
-- (the host cuts them so): `n` emit, `b` their netstrings (a batch as
-- the host sent it, or cut again when the fence refused some of its
-- events), `k` how many, `c` and `e` the counters of bytes and events
-- after it. An entry costs Redis about as much as its fields, whatever
-- they hold: sharing one is what makes an event cheap. Readers give each
-- event the id `<entry id>.<index>` (see pulse-streams' `Event`).
--
-- Bounds of the events stream: it never holds more than ARGV[2] bytes of
-- events (their netstrings), but for its newest entry, which always
-- stays: one plugin emitting large events cannot fill Redis. By count,
-- it holds at least ARGV[1] events (once that many were written, and the
-- byte bound allows) and at most 127 more: entries are trimmed whole, and
-- none holds more than 64 events and a sixteenth of ARGV[2] bytes (or one
-- larger event). The counters say what the stream holds without reading
-- it: the newest counter less the oldest entry's, less what that entry
-- holds. Each time the events counter passes a multiple of 64, or the
-- bytes counter a sixteenth of ARGV[2], the oldest entry is read. When
-- the bytes held are within a sixteenth of ARGV[2] or past it, the oldest
-- entries are read and trimmed until at most fourteen sixteenths of
-- ARGV[2] bytes are left and no more than ARGV[1] + 63 events. When only
-- the events are past ARGV[1], the first entry to keep is looked for by
-- its time (entry ids are times, and the counters say where between two
-- entries the events to drop end): a few reads of one entry, then one
-- `XTRIM MINID`.
--
-- Entries without `c` or `e` were written by earlier versions, one event
-- each. The bytes counter starts from KEYS[4], where those versions kept
-- the bytes the stream held, and the events counter from the stream's
-- length: those entries count as written before every later one.
--
-- A call costs an HMGET per 1,000 items, an HSET per state; for its
-- events, an XADD per entry and two INCRBY; one in about 64 events, a
-- few reads of one entry and an XTRIM; then an XADD per answer and an
-- XDEL per worker.
local n, answers, batches = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[8])
-- The kinds are ARGV[keys_at], item i's key ARGV[keys_at + i], its
-- needle ARGV[needles_at + i]: the loops over items index ARGV and call
-- the string functions through locals, because in Redis's Lua a function
-- call or a global lookup per item is a large share of an item's check
-- (BENCHMARKS.md, "Fewer Lua steps"); the keys are together, for one
-- `HMGET` without a table made of them.
local workers = tonumber(ARGV[3])
local items_at = 8 + 2 * batches
local keys_at = items_at + workers + 1
local kinds = ARGV[keys_at]
local needles_at = keys_at + n
local find, byte, sub = string.find, string.byte, string.sub
local owners
for first = 1, n, 1000 do
  local last = math.min(n, first + 999)
  local got = redis.call('HMGET', KEYS[1], unpack(ARGV, keys_at + first, keys_at + last))
  if first == 1 and last == n then
    owners = got
  else
    owners = owners or {}
    for i = first, last do owners[i] = got[i - first + 1] end
  end
end
-- An owner `state|worker|token|seq` is this worker's under this token
-- when it begins with the item's needle, `running|worker|token|` (made by
-- the host), or is `moving` with the rest of it: plain finds, no
-- captures, and a string made only for a job that is not running.
-- The events that passed, whether one was refused, how many states and
-- finishes there are together, and the keys of jobs finished in this
-- call (they take no later item).
local all_events = kinds == ''
local flags, events, refused, others, finished = {}, 0, false, 0, nil
for i = 1, n do
  local owner, kind = owners[i], all_events and 101 or byte(kinds, i)
  local ok = false
  if owner then
    local needle = ARGV[needles_at + i]
    local at = find(owner, needle, 1, true)
    ok = at == 1 or (not at and byte(owner, 1) == 109 and find(owner, sub(needle, 8), 1, true) == 7)
    if ok and finished and finished[ARGV[keys_at + i]] then ok = false end
  end
  flags[i] = ok and '1' or '0'
  if kind == 101 then -- `e`
    if ok then events = events + 1 else refused = true end
  else
    others = others + 1
    if ok and kind == 102 then -- `f`
      finished = finished or {}
      finished[ARGV[keys_at + i]] = true
    end
  end
end
flags = table.concat(flags)

-- States and finishes, each with its keys, in order; `worker` is item i's,
-- `left` how many of its items come after item i.
local at_key, at_state = 6 + 2 * workers, needles_at + n + 1
local worker, left = 0, 0
for i = 1, others > 0 and n or 0 do
  while left == 0 do worker, left = worker + 1, tonumber(ARGV[items_at + worker + 1]) end
  left = left - 1
  local kind, key = byte(kinds, i), ARGV[keys_at + i]
  if kind == 115 then
    if byte(flags, i) == 49 then redis.call('HSET', KEYS[at_key], 'state', ARGV[at_state]) end
    at_key, at_state = at_key + 1, at_state + 1
  elseif kind == 102 then
    if byte(flags, i) == 49 then
      redis.call('HDEL', KEYS[1], key)
      redis.call('DEL', KEYS[at_key], KEYS[at_key + 1])
      redis.call('SREM', KEYS[5 + 2 * worker], key)
    end
    at_key = at_key + 2
  end
end

-- The answers and the inbox entries processed.
local at_arg = at_state
for a = 0, answers - 1 do
  local name, payload = ARGV[at_arg + 2 * a], ARGV[at_arg + 2 * a + 1]
  local prev = ARGV[7] == '1' and last_id(KEYS[at_key + a])
  local id = redis.call('XADD', KEYS[at_key + a], 'NOMKSTREAM', 'MAXLEN', '~', ARGV[4], '*', 'n', name, 'p', payload)
  -- A node that is gone has no stream, so nobody to ring.
  if id and prev then ring(KEYS[at_key + a], prev, {rung(id, name, payload)}) end
end
local at_delete = at_arg + 2 * answers
for w = 1, workers do
  local deletes = tonumber(ARGV[at_delete])
  if deletes > 0 then redis.call('XDEL', KEYS[4 + 2 * w], unpack(ARGV, at_delete + 1, at_delete + deletes)) end
  at_delete = at_delete + 1 + deletes
end

if events == 0 then return flags end
local max_events, max_bytes = tonumber(ARGV[1]), tonumber(ARGV[2])
local step = math.max(1, math.floor(max_bytes / 16))
-- The entries: the batches as sent when every event passed (no table
-- made: a call commonly writes one); otherwise the events that passed,
-- cut again (up to 64 and `step` bytes to an entry).
local entries, added = nil, 0
if not refused then
  for j = 1, batches do added = added + #ARGV[8 + j] end
else
  -- Each event is two netstrings of its batch (key, payload), the
  -- batches in the order of the events.
  local function skip(packed, at)
    local colon = find(packed, ':', at, true)
    return colon + tonumber(sub(packed, at, colon - 1)) + 2
  end
  entries = {}
  local pieces, size, batch, packed, at = {}, 0, 0, '', 1
  for i = 1, n do
    if all_events or byte(kinds, i) == 101 then
      if at > #packed then batch, packed, at = batch + 1, ARGV[8 + batch + 1], 1 end
      local start = at
      at = skip(packed, skip(packed, at))
      if byte(flags, i) == 49 then
        local piece = sub(packed, start, at - 1)
        if #pieces > 0 and (#pieces == 64 or size + #piece > step) then
          entries[#entries + 1] = {table.concat(pieces), #pieces}
          pieces, size = {}, 0
        end
        pieces[#pieces + 1] = piece
        size = size + #piece
      end
    end
  end
  entries[#entries + 1] = {table.concat(pieces), #pieces}
  for _, entry in ipairs(entries) do added = added + #entry[1] end
end
local total = redis.call('INCRBY', KEYS[3], added)
if total == added then
  -- A new counter: what an earlier version's entries hold comes first.
  local earlier = tonumber(redis.call('GET', KEYS[4]) or 0) or 0
  if earlier > 0 then total = redis.call('INCRBY', KEYS[3], earlier) end
end
local count = redis.call('INCRBY', KEYS[5], events)
if count == events then
  -- A new counter: the entries already there hold one event each.
  local earlier = redis.call('XLEN', KEYS[2])
  if earlier > 0 then count = redis.call('INCRBY', KEYS[5], earlier) end
end
local bytes_at, events_at = total - added, count - events
local newest
local function add(packed, k)
  bytes_at, events_at = bytes_at + #packed, events_at + k
  newest = redis.call('XADD', KEYS[2], '*', 'n', 'emit', 'b', packed, 'k', k,
    'c', string.format('%d', bytes_at), 'e', string.format('%d', events_at))
end
if not entries then
  if batches == 1 then add(ARGV[9], events)
  else for j = 1, batches do add(ARGV[8 + j], tonumber(ARGV[8 + batches + j])) end end
else
  for _, entry in ipairs(entries) do add(entry[1], entry[2]) end
end
if math.floor(count / 64) == math.floor((count - events) / 64)
    and math.floor(total / step) == math.floor((total - added) / step) then
  return flags
end

-- An entry's counters after it (nil for an earlier version's entry), and
-- the bytes and events it holds.
local function counted(entry)
  local fields, c, e, size, k = entry[2], nil, nil, 0, 1
  for i = 1, #fields, 2 do
    local field = fields[i]
    if field == 'c' then c = tonumber(fields[i + 1])
    elseif field == 'e' then e = tonumber(fields[i + 1])
    elseif field == 'b' or field == 'p' then size = #fields[i + 1]
    elseif field == 'k' then k = tonumber(fields[i + 1]) end
  end
  return c, e, size, k
end
-- An entry id's milliseconds and sequence number.
local function id_parts(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
-- The id of the first entry whose events counter is past `target`,
-- between `lo` (at or before it) and `hi` (past it), both {id, e}; nil
-- when an earlier version's entry is met or the search takes too long.
-- Entry ids are times, so the counter's place is guessed between the two
-- times and one entry read there: a few reads where walking would read
-- every entry before it. Between two entries of one millisecond the
-- guess is by sequence number: entries added in one millisecond have
-- consecutive ones (the stream is trimmed only from its front), and a
-- busy pool adds dozens a millisecond. A guess that finds no entry
-- before `hi` reads the one just before `hi` instead.
local function first_past(target, lo, hi)
  for _ = 1, 16 do
    local lo_ms, lo_seq = id_parts(lo.id)
    local hi_ms, hi_seq = id_parts(hi.id)
    if lo_ms == hi_ms and hi_seq == lo_seq + 1 then return hi.id end
    local share = (target - lo.e) / (hi.e - lo.e)
    local start
    if lo_ms == hi_ms then
      start = string.format('%d-%d', lo_ms, math.max(lo_seq + 1, lo_seq + math.floor((hi_seq - lo_seq) * share)))
    else
      start = string.format('%d-0', math.max(lo_ms + 1, lo_ms + math.floor((hi_ms - lo_ms) * share)))
    end
    local entry = redis.call('XRANGE', KEYS[2], start, '+', 'COUNT', 1)[1]
    local before_hi = entry and entry[1] == hi.id
    if before_hi then entry = redis.call('XREVRANGE', KEYS[2], '(' .. hi.id, '-', 'COUNT', 1)[1] end
    if not entry then return nil end
    local _, e, _, k = counted(entry)
    if not e then return nil end
    if e > target then
      -- Its events begin at or before the one after `target`: it is
      -- the first past it, and no entry before it needs a read.
      if e - k <= target then return entry[1] end
      hi = {id = entry[1], e = e}
    elseif before_hi then
      return hi.id -- nothing between this entry and `hi`
    else
      lo = {id = entry[1], e = e}
    end
  end
  return nil
end
-- The oldest entry, and what was written before it, that is trimmed
-- already (0 before an earlier version's entry: the counters began with
-- those).
local batch = redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 1)
if not batch[1] then return flags end
local c_oldest, e_oldest, size_oldest, k_oldest = counted(batch[1])
local bytes_trimmed = c_oldest and c_oldest - size_oldest or 0
local events_trimmed = e_oldest and e_oldest - k_oldest or 0
local keep_bytes = max_bytes - 2 * step
if total - bytes_trimmed <= max_bytes - step then
  -- Within the byte bound until the next check: by count, the first
  -- entry past the events to drop is found by its time, and everything
  -- before it goes.
  local target = count - max_events
  -- The oldest entry holds events to keep: nothing goes.
  if e_oldest and e_oldest > target then return flags end
  local keep = e_oldest and first_past(target, {id = batch[1][1], e = e_oldest}, {id = newest, e = count})
  if keep then
    redis.call('XTRIM', KEYS[2], 'MINID', keep)
    return flags
  end
  -- An earlier version's entry, or a search that gave up: the walk below.
end
-- Oldest first: past the byte bound, entries go until it is kept; by
-- count, as many as leave at least `max_events` events.
local len = redis.call('XLEN', KEYS[2])
local last, done = nil, false
while not done and len > 1 do
  batch = batch or redis.call('XRANGE', KEYS[2], '(' .. last, '+', 'COUNT', 64)
  if #batch == 0 then break end
  for _, entry in ipairs(batch) do
    local c, e, size, k = counted(entry)
    local bytes_after, events_after = c or bytes_trimmed + size, e or events_trimmed + k
    if len <= 1 or (total - bytes_trimmed <= keep_bytes and count - events_after < max_events) then
      done = true
      break
    end
    bytes_trimmed, events_trimmed = bytes_after, events_after
    len = len - 1
    last = entry[1]
  end
  batch = nil
end
if last then
  -- Everything up to and including `last`: MINID keeps ids from the one after.
  local ms, seq = id_parts(last)
  redis.call('XTRIM', KEYS[2], 'MINID', string.format('%d-%d', ms, seq + 1))
end
return flags
