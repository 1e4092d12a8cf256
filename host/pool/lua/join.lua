-- join(worker, entry, ttl, epoch, slots) -> {'joined', rev} | {'shutdown'} | {'epoch', current}
--
-- KEYS[1] slot table   KEYS[2] workers map   KEYS[3] leases
-- KEYS[4] shutdown flag   KEYS[5] pool epoch
-- ARGV[1] slot table channel  ARGV[2] workers map channel
-- ARGV[3] epoch for a map that has none  ARGV[4] worker
-- ARGV[5] its workers entry (`node|join number`)  ARGV[6] lease ttl in ms
-- ARGV[7] the pool epoch the node joined  ARGV[8] the pool's slot count
-- (recorded in that epoch)  ARGV[9] the worker it replaces, or ''
--
-- Makes `worker` a member: its entry, its lease (on Redis time) and its
-- share of the slot table (take_slots), in one step, so two workers
-- joining at once never take the same slots and no table is ever seen
-- with a worker that has no lease. Refused while the pool shuts down, and
-- when the pool epoch is not the node's (Redis lost the pool's data: the
-- node must learn of it first). Joining twice keeps the slots held.
-- A worker that replaces another (a new release of its handler) takes
-- exactly that worker's slots (inherit_slots): only its keys move.
-- Answers the slot table's revision after the join.
local slots = {hash = KEYS[1], channel = ARGV[1], epoch = ARGV[3]}
local workers = {hash = KEYS[2], channel = ARGV[2], epoch = ARGV[3]}
local worker = ARGV[4]
if redis.call('EXISTS', KEYS[4]) == 1 then return {'shutdown'} end
local epoch = redis.call('GET', KEYS[5])
if epoch ~= ARGV[7] then return {'epoch', epoch or ''} end
redis.call('ZADD', KEYS[3], tonumber(now_ms()) + tonumber(ARGV[6]), worker)
if redis.call('HGET', KEYS[2], worker) ~= ARGV[5] then rmap_set(workers, worker, ARGV[5]) end
if ARGV[9] == '' or not inherit_slots(slots, worker, ARGV[9]) then
  take_slots(slots, worker, tonumber(ARGV[8]))
end
return {'joined', redis.call('HGET', KEYS[1], '=rev') or '0'}
