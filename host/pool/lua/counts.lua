-- counts(worker job sets...) -> {jobs, queued, owned}
--
-- KEYS[1] jobs hash   KEYS[2] queued set   KEYS[3..] each worker's job set
--
-- How many jobs the pool holds, how many wait for a worker and how many
-- workers own (running or moving); the rest are failed. O(workers), not
-- O(jobs): what metrics read on every scrape. One step, so the three
-- agree.
local owned = 0
for i = 3, #KEYS do
  owned = owned + redis.call('SCARD', KEYS[i])
end
return {redis.call('HLEN', KEYS[1]), redis.call('SCARD', KEYS[2]), owned}
