-- destroy() -> {rev, epoch}: deletes the hash and publishes `destroy` with
-- the revision that follows the last one, so replicas clear and forget the
-- epoch. A later write creates the map anew under a new epoch.
local epoch = redis.call('HGET', hash, '=epoch')
if not epoch then
  redis.call('DEL', hash)
  return {0, ''}
end
local rev = tonumber(redis.call('HGET', hash, '=rev') or '0') + 1
redis.call('DEL', hash)
redis.call('PUBLISH', channel, ns('destroy') .. ns(epoch) .. ns(tostring(rev)))
return {rev, epoch}
