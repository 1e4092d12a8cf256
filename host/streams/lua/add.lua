-- add(name, payload, topic) -> id, or the error `STREAMFULL …`.
--
-- KEYS[1]  the stream
-- ARGV[1]  max length, 0 for none
-- ARGV[2]  time to live in ms, 0 for none
-- ARGV[3]  `sliding` or `absolute`
-- ARGV[4]  event name, ARGV[5] payload, ARGV[6] topic ('' for none)
--
-- Why a script: making room must look at every consumer group and trim
-- only what all of them have acknowledged, then add, with no other client
-- adding or reading in between. When the stream is at its max length and
-- nothing can be trimmed, the add is refused: an event is never dropped to
-- make room for another.
local stream = KEYS[1]
local max_len = tonumber(ARGV[1])

-- Compares two stream ids ("ms-seq"): true when a < b.
local function before(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  am, as, bm, bs = tonumber(am), tonumber(as), tonumber(bm), tonumber(bs)
  return am < bm or (am == bm and as < bs)
end

-- The id right after `id`: the first one a trim must keep when `id` and
-- everything before it are acknowledged.
local function after(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return ms .. '-' .. tostring(tonumber(seq) + 1)
end

if max_len > 0 and redis.call('EXISTS', stream) == 1 and redis.call('XLEN', stream) >= max_len then
  local groups = redis.call('XINFO', 'GROUPS', stream)
  local keep_from = nil
  if #groups == 0 then
    -- No group tracks this stream: readers follow it on their own, and the
    -- oldest entries go first, as with MAXLEN.
    redis.call('XTRIM', stream, 'MAXLEN', max_len - 1)
  else
    for _, group in ipairs(groups) do
      local info = {}
      for i = 1, #group, 2 do info[group[i]] = group[i + 1] end
      local first_needed
      if tonumber(info['pending']) > 0 then
        first_needed = redis.call('XPENDING', stream, info['name'], '-', '+', 1)[1][1]
      else
        first_needed = after(info['last-delivered-id'])
      end
      if keep_from == nil or before(first_needed, keep_from) then keep_from = first_needed end
    end
    redis.call('XTRIM', stream, 'MINID', keep_from)
  end
  if redis.call('XLEN', stream) >= max_len then
    return redis.error_reply('STREAMFULL stream ' .. stream .. ' holds ' .. max_len ..
      ' events its consumer groups have not all acknowledged')
  end
end

local id
if ARGV[6] ~= '' then
  id = redis.call('XADD', stream, '*', 'n', ARGV[4], 'p', ARGV[5], 't', ARGV[6])
else
  id = redis.call('XADD', stream, '*', 'n', ARGV[4], 'p', ARGV[5])
end
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  if ARGV[3] == 'sliding' then
    redis.call('PEXPIRE', stream, ttl)
  else
    redis.call('PEXPIRE', stream, ttl, 'NX')
  end
end
return id
