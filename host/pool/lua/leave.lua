-- leave(worker, mode) -> 1
--
-- KEYS[1] slot table   KEYS[2] workers map   KEYS[3] leases
-- KEYS[4] the worker's inbox   KEYS[5] the worker's job set
-- ARGV[1] slot table channel  ARGV[2] workers map channel
-- ARGV[3] epoch for a map that has none  ARGV[4] worker
-- ARGV[5] `slot`: give up the slot only (no new job routes to the worker
-- while it hands its jobs back; it stays a member with a lease), or `all`:
-- leave the pool (entry, lease, inbox and job set go too).
local slots = {hash = KEYS[1], channel = ARGV[1], epoch = ARGV[3]}
local workers = {hash = KEYS[2], channel = ARGV[2], epoch = ARGV[3]}
local worker = ARGV[4]
swap_remove(slots, worker)
if ARGV[5] == 'all' then
  rmap_del(workers, worker)
  redis.call('ZREM', KEYS[3], worker)
  redis.call('DEL', KEYS[4], KEYS[5])
end
return 1
