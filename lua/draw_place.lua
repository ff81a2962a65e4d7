-- draw_place.lua: put drawn pre-queue users in line at the seqs the draw dealt them. Idempotent.
-- A user no longer in the pre-queue left it meanwhile, and is not placed.
-- KEYS[1] waiting     zset: user id -> seq
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms)
-- KEYS[3] prequeue    zset: user id -> arrival seq
-- ARGV[1] now_ms         now (ms)
-- ARGV[2..] placements  user id, seq, user id, seq, ...
-- Returns 1.
local waiting, heartbeat, prequeue = unpack(KEYS)
local now_ms = unpack(ARGV)
for i = 2, #ARGV, 2 do
  if redis.call('ZSCORE', prequeue, ARGV[i]) then
    redis.call('ZADD', waiting, ARGV[i + 1], ARGV[i])
    -- Their heartbeat starts now: they could not poll a place they did not have.
    redis.call('ZADD', heartbeat, now_ms, ARGV[i])
  end
end
-- A line this creates expires with the pre-queue it comes from (the pump slides both while it visits the target).
local ttl = redis.call('PTTL', prequeue)
if ttl > 0 then
  redis.call('PEXPIRE', waiting, ttl, 'NX')
  redis.call('PEXPIRE', heartbeat, ttl, 'NX')
end
return 1
