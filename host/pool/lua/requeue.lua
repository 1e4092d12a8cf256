-- requeue(key, token, reply, request, held...) -> 1, or 0 when the token
-- is not the job's.
--
-- KEYS[1] jobs hash   KEYS[2] the job's record   KEYS[3] queued set
-- KEYS[4] the worker's job set   KEYS[5] the job's held events
-- ARGV[1] key  ARGV[2] the token the worker holds
-- ARGV[3] reply stream and ARGV[4] request of a start nobody was answered
-- for yet (empty: none)  ARGV[5..] events that waited behind that start,
-- in order, as held events
--
-- A worker that leaves hands a job it stopped back to the pool: the job
-- waits (its events are held meanwhile) until it is assigned to a worker,
-- which starts it with `requeued` set and the state it saved. Fenced by the
-- token, in one step.
--
-- A job whose start the worker held or was retrying never ran there: the
-- dispatcher still waiting for its start is answered by the next worker
-- (assign.lua sends the start with the record's `reply` and `request`),
-- and the events that waited behind the start go first among its held
-- events, so none is lost and their order stays.
local job = parse(redis.call('HGET', KEYS[1], ARGV[1]))
if not job or job.token ~= ARGV[2] or (job.state ~= 'running' and job.state ~= 'moving') then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ownership('queued', '', job.token, job.seq))
redis.call('HSET', KEYS[2], 'requeued', '1')
note(KEYS[2], 'returned', job.worker)
if ARGV[3] ~= '' then redis.call('HSET', KEYS[2], 'reply', ARGV[3], 'request', ARGV[4]) end
for i = #ARGV, 5, -1 do redis.call('LPUSH', KEYS[5], ARGV[i]) end
redis.call('SADD', KEYS[3], ARGV[1])
redis.call('SREM', KEYS[4], ARGV[1])
return 1
