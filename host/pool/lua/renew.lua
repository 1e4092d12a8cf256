-- renew(ttl, epoch, identity, workers...) -> {'ok' | 'shutdown', flag per
--   worker} | {'epoch', current}
--
-- KEYS[1] workers map   KEYS[2] leases   KEYS[3] pool epoch
-- KEYS[4] shutdown flag   KEYS[5] the node's identity (a hash)
-- ARGV[1] lease ttl in ms  ARGV[2] the pool epoch the node joined
-- ARGV[3] the node's identity, `host|pid|version|http`, or '' to keep none
-- ARGV[4…] the node's workers
--
-- Renews the leases of a node's workers to Redis time + ttl. A worker that
-- is no longer a member (it was evicted) gets flag 0 and no lease: a
-- renewal never brings an evicted worker back. The first item says
-- whether the pool is shutting down; a changed epoch means Redis lost the
-- pool's data. The node's identity lives as long as three leases past its
-- last renewal: a node that died leaves nothing behind for long; `started`
-- is the Redis time it was first written.
local epoch = redis.call('GET', KEYS[3])
if epoch ~= ARGV[2] then return {'epoch', epoch or ''} end
local out = {redis.call('EXISTS', KEYS[4]) == 1 and 'shutdown' or 'ok'}
local now = now_ms()
local deadline = tonumber(now) + tonumber(ARGV[1])
if ARGV[3] ~= '' then
  local host, pid, version, http = string.match(ARGV[3], '^([^|]*)|([^|]*)|([^|]*)|(.*)$')
  redis.call('HSET', KEYS[5], 'host', host or '', 'pid', pid or '', 'version', version or '', 'http', http or '')
  redis.call('HSETNX', KEYS[5], 'started', now)
  redis.call('PEXPIRE', KEYS[5], 3 * tonumber(ARGV[1]))
end
for i = 4, #ARGV do
  local worker = ARGV[i]
  if redis.call('HEXISTS', KEYS[1], worker) == 1 and redis.call('ZSCORE', KEYS[2], worker) then
    redis.call('ZADD', KEYS[2], 'XX', deadline, worker)
    out[#out + 1] = '1'
  else
    out[#out + 1] = '0'
  end
end
return out
