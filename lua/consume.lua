-- consume.lua: use an entry token once. Exactly one of any number of concurrent calls succeeds.
-- KEYS[1] consumed   this token id's one-time marker (lives as long as the token itself)
-- KEYS[2] active     zset: user id -> expiry (ms) of their issued, unconsumed entry token (for maxActive)
-- ARGV[1] a fresh consumption id, so only this consumption can restore the token
-- ARGV[2] the token's remaining lifetime (ms)   ARGV[3] the token's user id
-- Returns 1 if this call consumed the token, 0 if it was already used.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('ZREM', KEYS[2], ARGV[3])
  return 1
end
return 0
