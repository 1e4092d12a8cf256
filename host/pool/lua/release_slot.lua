-- release_slot(worker) -> 1
--
-- KEYS[1] slot table   KEYS[2] workers map   KEYS[3] leases
-- ARGV[1] slot table channel  ARGV[2] workers map channel
-- ARGV[3] epoch for a map that has none  ARGV[4] worker
--
-- The first step of leaving: the worker's slot is swap-removed, so no new
-- job routes to it while it hands its jobs back; it stays a member with
-- its lease. It leaves for good by eviction (evict.lua), which also queues
-- anything it still owned.
local slots = {hash = KEYS[1], channel = ARGV[1], epoch = ARGV[3]}
swap_remove(slots, ARGV[4])
return 1
