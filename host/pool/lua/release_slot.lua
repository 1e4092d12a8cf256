-- release_slot(worker...) -> rev
--
-- KEYS[1] slot table   KEYS[2] workers map   KEYS[3] leases
-- ARGV[1] slot table channel  ARGV[2] workers map channel
-- ARGV[3] epoch for a map that has none  ARGV[4...] the workers
--
-- The first step of leaving: the workers' slots go to the least loaded
-- of the workers that stay and are alive (give_up_slots), so no new job routes to them
-- while they hand their jobs back; they stay members with their leases.
-- They leave for good by eviction (evict.lua), which also queues anything
-- they still owned. All of a host's leaving workers give up their slots
-- in one step, so no slot passes from one of them to another that is
-- leaving too. Answers the slot table's revision after the change.
local slots = {hash = KEYS[1], channel = ARGV[1], epoch = ARGV[3]}
local leavers = {}
for i = 4, #ARGV do
  leavers[ARGV[i]] = true
end
give_up_slots(slots, leavers, KEYS[3])
return tonumber(redis.call('HGET', KEYS[1], '=rev') or '0')
