-- emit(key, token, payload, max_len, max_bytes) -> the event id, or ''
-- when the token is not the job's.
--
-- KEYS[1] jobs hash   KEYS[2] the pool's events stream   KEYS[3] the
-- payload bytes the stream holds (a counter)
-- ARGV[1] key  ARGV[2] token  ARGV[3] payload  ARGV[4] entries the events
-- stream keeps  ARGV[5] payload bytes it keeps
--
-- Fenced by the token in one step: a worker that lost the job emits
-- nothing in its name. The stream never holds more than ARGV[5] payload
-- bytes, nor more than ARGV[4] + 64 entries (the newest entry always
-- stays): one plugin emitting large events cannot fill Redis. Trims come
-- in batches, to ARGV[4] entries and 15/16 of ARGV[5] bytes, so an emit
-- costs XADD, INCRBY and XLEN, and one in about 64 a trim.
local job = parse(redis.call('HGET', KEYS[1], ARGV[1]))
if not job or job.token ~= ARGV[2] or (job.state ~= 'running' and job.state ~= 'moving') then return '' end
local id = redis.call('XADD', KEYS[2], '*', 'n', 'emit', 'p', ARGV[3], 't', ARGV[1])
local total = redis.call('INCRBY', KEYS[3], #ARGV[3])
local len = redis.call('XLEN', KEYS[2])
local max_len, max_bytes = tonumber(ARGV[4]), tonumber(ARGV[5])
if len <= max_len + 64 and total <= max_bytes then return id end

local keep_len, keep_bytes = max_len, max_bytes - math.floor(max_bytes / 16)
local function over() return len > 1 and (len > keep_len or total > keep_bytes) end
local last = nil
while over() do
  local batch = redis.call('XRANGE', KEYS[2], last and ('(' .. last) or '-', '+', 'COUNT', 64)
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
if len <= 1 then total = #ARGV[3] end
redis.call('SET', KEYS[3], math.max(total, 0))
return id
