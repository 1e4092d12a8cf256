-- release_slot(worker...) -> 1
--
-- KEYS[1] slot table   KEYS[2] workers map   KEYS[3] leases
-- ARGV[1] slot table channel  ARGV[2] workers map channel
-- ARGV[3] epoch for a map that has none  ARGV[4...] the workers
--
-- The first step of leaving: the workers' slots are swap-removed, so no
-- new job routes to them while they hand their jobs back; they stay
-- members with their leases. They leave for good by eviction (evict.lua),
-- which also queues anything they still owned. All of a host's leaving
-- workers give up their slots in one step, so no job moves from one of
-- them to another that is leaving too.
local slots = {hash = KEYS[1], channel = ARGV[1], epoch = ARGV[3]}
for i = 4, #ARGV do
  swap_remove(slots, ARGV[i])
end
return 1
