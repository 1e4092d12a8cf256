-- emit(key, token, payload, max_len, max_bytes) -> the event id, or ''
-- when the token is not the job's.
--
-- KEYS[1] jobs hash   KEYS[2] the pool's events stream   KEYS[3] the
-- payload bytes the stream holds (a counter)
-- ARGV[1] key  ARGV[2] token  ARGV[3] payload  ARGV[4] entries the events
-- stream keeps  ARGV[5] payload bytes it keeps
--
-- Fenced by the token in one step: a worker that lost the job emits
-- nothing in its name. The oldest entries are trimmed, exactly, until the
-- stream holds at most ARGV[4] entries and ARGV[5] payload bytes (the
-- newest entry always stays): one plugin emitting large events cannot
-- fill Redis. In the steady state one entry is trimmed per emit.
local job = parse(redis.call('HGET', KEYS[1], ARGV[1]))
if not job or job.token ~= ARGV[2] or (job.state ~= 'running' and job.state ~= 'moving') then return '' end
local id = redis.call('XADD', KEYS[2], '*', 'n', 'emit', 'p', ARGV[3], 't', ARGV[1])
local total = redis.call('INCRBY', KEYS[3], #ARGV[3])
local max_len, max_bytes = tonumber(ARGV[4]), tonumber(ARGV[5])
local len = redis.call('XLEN', KEYS[2])
while len > max_len or (total > max_bytes and len > 1) do
  for _, entry in ipairs(redis.call('XRANGE', KEYS[2], '-', '+', 'COUNT', 16)) do
    if not (len > max_len or (total > max_bytes and len > 1)) then break end
    local fields = entry[2]
    for i = 1, #fields, 2 do
      if fields[i] == 'p' then total = total - #fields[i + 1] end
    end
    len = len - 1
    redis.call('XDEL', KEYS[2], entry[1])
  end
end
if len <= 1 then total = #ARGV[3] end
redis.call('SET', KEYS[3], math.max(total, 0))
return id
