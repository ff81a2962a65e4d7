-- evict.lua: remove users whose last poll is older than the heartbeat timeout, at most a given number
-- per call so that a mass departure never blocks Redis. Admitted users who never came back for their
-- token are still in line, so they go the same way. When nobody is left in line, the target's
-- `registered` marker is dropped: the pump may then forget it, and the next enter registers it again.
-- Eviction is final: each evicted entry's seq is recorded, so its ticket never restores the place (status.lua).
-- Presence counts only inside the presence window (line.lua): a silent user beyond its edge only leaves the
-- heartbeat set, keeping the place; its clock starts again when the place crosses into the window.
-- KEYS[1] waiting     zset: user id -> seq
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms); a pre-queued user's is the opening
-- KEYS[3] registered  present while the pump knows this target
-- KEYS[4] stats       hash of counters: `evicted` counts evictions
-- KEYS[5] prequeue    zset: users waiting for the opening (they keep the target known)
-- KEYS[6] events      the target's outbox stream (outbox.lua): UserEvicted; unpublished events keep the target known
-- KEYS[7] ended       zset: user id -> seq of their last entry that ended on purpose (left, evicted); the pump
--                     slides its TTL (admit.lua)
-- KEYS[8] window      the presence window's edge, the highest seq inside it (line.lua; none yet: all are inside)
-- ARGV[1] heartbeat_timeout_ms  heartbeat timeout (ms)
-- ARGV[2] max_evict             most users to evict
-- ARGV[3] outbox_cap            outbox cap (events)
-- ARGV[4] outbox_ttl_ms         outbox TTL (ms)
-- Returns {evicted, idle}: users evicted, and idle (0|1): nobody is left in line nor in the pre-queue, and no
-- event is unpublished (the `registered` marker was dropped)
local waiting, heartbeat, registered, stats, prequeue, events, ended, window = unpack(KEYS)
local heartbeat_timeout_ms, max_evict, outbox_cap, outbox_ttl_ms = unpack(ARGV)
local emit = outbox(events, stats, outbox_cap, outbox_ttl_ms)
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local silent = redis.call('ZRANGEBYSCORE', heartbeat, '-inf', now - tonumber(heartbeat_timeout_ms), 'LIMIT', 0,
  max_evict)
local edge = tonumber(redis.call('GET', window) or '') or math.huge
local stale = {}
-- In chunks: Lua's stack bounds how many arguments one call may take.
for i = 1, #silent, 1000 do
  local j = math.min(i + 999, #silent)
  local seqs = redis.call('ZMSCORE', waiting, unpack(silent, i, j))
  -- A pre-queued user's heartbeat is the opening they were last told: one silent past it goes too.
  local pre_queued = redis.call('ZMSCORE', prequeue, unpack(silent, i, j))
  local records, far = {}, {}
  for n = i, j do
    local seq = seqs[n - i + 1]
    if seq and tonumber(seq) > edge then
      far[#far + 1] = silent[n]
    else
      stale[#stale + 1] = silent[n]
      seq = seq or pre_queued[n - i + 1]
      if seq then
        records[#records + 1] = seq
        records[#records + 1] = silent[n]
      end
    end
  end
  if #records > 0 then
    redis.call('ZADD', ended, 'GT', unpack(records))
  end
  if #far > 0 then
    redis.call('ZREM', heartbeat, unpack(far))
  end
end
for i = 1, #stale, 1000 do
  local j = math.min(i + 999, #stale)
  redis.call('ZREM', waiting, unpack(stale, i, j))
  redis.call('ZREM', prequeue, unpack(stale, i, j))
  redis.call('ZREM', heartbeat, unpack(stale, i, j))
end
if #stale > 0 then
  redis.call('HINCRBY', stats, 'evicted', #stale)
end
for _, user in ipairs(stale) do
  emit('UserEvicted', 'user', user)
end
if redis.call('ZCARD', waiting) == 0 and redis.call('ZCARD', prequeue) == 0 and redis.call('XLEN', events) == 0 then
  redis.call('DEL', registered)
  return {#stale, 1}
end
return {#stale, 0}
