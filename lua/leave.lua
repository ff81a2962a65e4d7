-- leave.lua: take a user out of line (or out of the pre-queue), and drop any entry token they were issued.
-- Idempotent.
-- KEYS[1] waiting     zset: user id -> seq
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms)
-- KEYS[3] token       the grant of this user's issued entry token
-- KEYS[4] stats       hash of counters: `left` counts departures
-- KEYS[5] prequeue    zset: user id -> arrival seq, before opening
-- KEYS[6] active      zset: user id -> expiry (ms) of their issued, unconsumed entry token
-- ARGV[1] user id
-- Returns 1 if the user was in line, else 0.
local removed = math.max(redis.call('ZREM', KEYS[1], ARGV[1]), redis.call('ZREM', KEYS[5], ARGV[1]))
if removed == 1 then
  redis.call('HINCRBY', KEYS[4], 'left', 1)
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('DEL', KEYS[3])
return removed
