-- renew(ttl, epoch, workers...) -> {'ok' | 'shutdown', flag per worker}
--   | {'epoch', current}
--
-- KEYS[1] workers map   KEYS[2] leases   KEYS[3] pool epoch
-- KEYS[4] shutdown flag
-- ARGV[1] lease ttl in ms  ARGV[2] the pool epoch the node joined
-- ARGV[3…] the node's workers
--
-- Renews the leases of a node's workers to Redis time + ttl. A worker that
-- is no longer a member (it was evicted) gets flag 0 and no lease: a
-- renewal never brings an evicted worker back. The first item says
-- whether the pool is shutting down; a changed epoch means Redis lost the
-- pool's data.
local epoch = redis.call('GET', KEYS[3])
if epoch ~= ARGV[2] then return {'epoch', epoch or ''} end
local out = {redis.call('EXISTS', KEYS[4]) == 1 and 'shutdown' or 'ok'}
local deadline = tonumber(now_ms()) + tonumber(ARGV[1])
for i = 3, #ARGV do
  local worker = ARGV[i]
  if redis.call('HEXISTS', KEYS[1], worker) == 1 and redis.call('ZSCORE', KEYS[2], worker) then
    redis.call('ZADD', KEYS[2], 'XX', deadline, worker)
    out[#out + 1] = '1'
  else
    out[#out + 1] = '0'
  end
end
return out
