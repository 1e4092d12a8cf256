-- rollout(op, node, digest, arg) -> 'taken' | 'busy' | 'not-running' | 'ok' | 'stale'
--
-- KEYS[1] the pool's rollout record (a hash: digest, version, path, state,
-- reason, turn, turn_until, host:<node> = outcome)
-- ARGV[1] `take`, `done`, `undone`, `yield` or `halt`  ARGV[2] the node
-- ARGV[3] the digest of the release the node acts on
-- ARGV[4] take: how long the turn may last (ms); halt: why
--
-- A release announced for the whole pool goes through its hosts one at a
-- time: a host takes the turn (only while the rollout runs, and when no
-- other host holds it), replaces its workers, each judged by its upgrade
-- gate, and gives the turn back with its outcome: `done`, `undone` (it
-- went back to its earlier release on `rollout undo`), `halt` (its gate
-- refused the release: the rollout stops for every host, with the reason)
-- or `yield` (it left before it was done). A turn not given back in time
-- (its host died) lapses. Every step checks the digest, so a host acting
-- on a rollout replaced since changes nothing. Atomic: two hosts never
-- hold the turn at once.
local r = KEYS[1]
local op, node, digest = ARGV[1], ARGV[2], ARGV[3]
if redis.call('HGET', r, 'digest') ~= digest then return 'stale' end
local now = tonumber(now_ms())
if op == 'take' then
  if redis.call('HGET', r, 'state') ~= 'running' then return 'not-running' end
  local holder = redis.call('HGET', r, 'turn')
  local until_ms = tonumber(redis.call('HGET', r, 'turn_until') or '0') or 0
  if holder and holder ~= node and until_ms > now then return 'busy' end
  redis.call('HSET', r, 'turn', node, 'turn_until', tostring(now + tonumber(ARGV[4])))
  return 'taken'
end
if op ~= 'yield' then redis.call('HSET', r, 'host:' .. node, op) end
if redis.call('HGET', r, 'turn') == node then redis.call('HDEL', r, 'turn', 'turn_until') end
if op == 'halt' then redis.call('HSET', r, 'state', 'halted', 'reason', ARGV[4]) end
return 'ok'
