-- emit(max_len, max_bytes, n, key1, token1, payload1, …) -> {id1, …}: each
-- event's id, or '' when its token is not its job's.
--
-- KEYS[1] jobs hash   KEYS[2] the pool's events stream   KEYS[3] the
-- payload bytes the stream holds (a counter)
-- ARGV[1] entries the events stream keeps  ARGV[2] payload bytes it keeps
-- ARGV[3] n  then each event's job key, token and payload
--
-- Fenced by the token in one step: a worker that lost a job emits nothing
-- in its name. A worker sends the events its jobs emitted since its last
-- round trip in one call, in the order they were emitted. The stream never
-- holds more than ARGV[2] payload bytes, nor more than ARGV[1] + 64
-- entries (the newest entry always stays): one plugin emitting large
-- events cannot fill Redis. Trims come in batches, to ARGV[1] entries and
-- 15/16 of ARGV[2] bytes, so a call costs HMGET, an XADD per event,
-- INCRBY and XLEN, and one in about 64 a trim.
local n = tonumber(ARGV[3])
local keys = {}
for i = 1, n do keys[i] = ARGV[1 + 3 * i] end
local owners = redis.call('HMGET', KEYS[1], unpack(keys))
local ids, written, added, last_size = {}, 0, 0, 0
for i = 1, n do
  local key, token, payload = ARGV[1 + 3 * i], ARGV[2 + 3 * i], ARGV[3 + 3 * i]
  local job = parse(owners[i])
  if job and job.token == token and (job.state == 'running' or job.state == 'moving') then
    ids[i] = redis.call('XADD', KEYS[2], '*', 'n', 'emit', 'p', payload, 't', key)
    written = written + 1
    added = added + #payload
    last_size = #payload
  else
    ids[i] = ''
  end
end
if written == 0 then return ids end
local total = redis.call('INCRBY', KEYS[3], added)
local len = redis.call('XLEN', KEYS[2])
local max_len, max_bytes = tonumber(ARGV[1]), tonumber(ARGV[2])
if len <= max_len + 64 and total <= max_bytes then return ids end

local keep_len, keep_bytes = max_len, max_bytes - math.floor(max_bytes / 16)
local function over() return len > 1 and (len > keep_len or total > keep_bytes) end
local last = nil
while over() do
  -- The entries past the count's limit in one read (the usual trim, by
  -- count alone, takes one instead of two), 64 to 1,024 at a time: each
  -- entry read is converted for Lua, most of what a trim costs.
  local count = math.min(math.max(len - keep_len, 64), 1024)
  local batch = redis.call('XRANGE', KEYS[2], last and ('(' .. last) or '-', '+', 'COUNT', count)
  if #batch == 0 then break end
  for _, entry in ipairs(batch) do
    if not over() then break end
    local fields = entry[2]
    for i = 1, #fields, 2 do
      if fields[i] == 'p' then total = total - #fields[i + 1] end
    end
    len = len - 1
    last = entry[1]
  end
end
if last then
  -- Everything up to and including `last`: MINID keeps ids from the one after.
  local ms, seq = string.match(last, '^(%d+)-(%d+)$')
  redis.call('XTRIM', KEYS[2], 'MINID', ms .. '-' .. tostring(tonumber(seq) + 1))
end
if len <= 1 then total = last_size end
redis.call('SET', KEYS[3], math.max(total, 0))
return ids
