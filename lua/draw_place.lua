-- draw_place.lua: put drawn pre-queue users in line at the seqs the draw dealt them. Idempotent.
-- KEYS[1] waiting     zset: user id -> seq
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms)
-- KEYS[3] prequeue    zset: user id -> arrival seq
-- ARGV[1] now (ms), then user id, seq, user id, seq, ...
-- A user no longer in the pre-queue left it meanwhile, and is not placed.
for i = 2, #ARGV, 2 do
  if redis.call('ZSCORE', KEYS[3], ARGV[i]) then
    redis.call('ZADD', KEYS[1], ARGV[i + 1], ARGV[i])
    -- Their heartbeat starts now: they could not poll a place they did not have.
    redis.call('ZADD', KEYS[2], ARGV[1], ARGV[i])
  end
end
-- A line this creates expires with the pre-queue it comes from (the pump slides both while it visits the target).
local ttl = redis.call('PTTL', KEYS[3])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl, 'NX')
  redis.call('PEXPIRE', KEYS[2], ttl, 'NX')
end
return 1
