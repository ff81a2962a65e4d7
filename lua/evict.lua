-- evict.lua: remove users whose last poll is older than the heartbeat timeout, at most a given number
-- per call so that a mass departure never blocks Redis. Admitted users who never came back for their
-- token are still in line, so they go the same way. When nobody is left in line, the target's
-- `registered` marker is dropped: the pump may then forget it, and the next enter registers it again.
-- KEYS[1] waiting     zset: user id -> seq
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms)
-- KEYS[3] registered  present while the pump knows this target
-- KEYS[4] stats       hash of counters: `evicted` counts evictions
-- KEYS[5] prequeue    zset: users waiting for the opening (they have no heartbeat yet, and keep the target known)
-- KEYS[6] events      the target's outbox stream (outbox.lua): UserEvicted; unpublished events keep the target known
-- ARGV[1] heartbeat timeout (ms)   ARGV[2] most users to evict   ARGV[3] outbox cap (events)   ARGV[4] outbox TTL (ms)
-- Returns {users evicted, idle (0|1)}
local emit = outbox(KEYS[6], KEYS[4], ARGV[3], ARGV[4])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[1]), 'LIMIT', 0, ARGV[2])
-- In chunks: Lua's stack bounds how many arguments one call may take.
for i = 1, #stale, 1000 do
  local j = math.min(i + 999, #stale)
  redis.call('ZREM', KEYS[1], unpack(stale, i, j))
  redis.call('ZREM', KEYS[2], unpack(stale, i, j))
end
if #stale > 0 then
  redis.call('HINCRBY', KEYS[4], 'evicted', #stale)
end
for _, user in ipairs(stale) do
  emit('UserEvicted', 'user', user)
end
if redis.call('ZCARD', KEYS[1]) == 0 and redis.call('ZCARD', KEYS[5]) == 0 and redis.call('XLEN', KEYS[6]) == 0 then
  redis.call('DEL', KEYS[3])
  return {#stale, 1}
end
return {#stale, 0}
