-- restore.lua: settle a consumption whose purchase did not end in an answer from the shop it stands by.
-- 'unused': the shop certainly did not take the order (nothing was sent, or it said so): the token is whole again.
-- 'unknown': the outcome is unknown (a timeout, a 5xx): the token stays used, but a retry may take it over.
-- KEYS[1] consumed   this token id's one-time marker
-- KEYS[2] active     zset: user id -> expiry (ms) of their issued, unconsumed entry token (for maxActive)
-- ARGV[1] the consumption id that consume.lua stored   ARGV[2] the token's user id   ARGV[3] its expiry (epoch ms)
-- ARGV[4] 'unused' | 'unknown'
-- KEYS[3] events     the target's outbox stream (outbox.lua): TokenRestored
-- KEYS[4] stats      the target's counters (the outbox's dropped count)
-- ARGV[5] the token id   ARGV[6] outbox cap (events)   ARGV[7] outbox TTL (ms)
-- A marker holding another consumption id belongs to a later use, which must stand; an expired marker is gone.
-- Returns 1 if the consumption was settled, else 0.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[4] == 'unknown' then
  redis.call('SET', KEYS[1], 'unknown', 'KEEPTTL')
  return 1
end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
-- The pump may have let `active` expire meanwhile: a new one lives at least as long as this token.
redis.call('PEXPIREAT', KEYS[2], ARGV[3], 'NX')
redis.call('PEXPIREAT', KEYS[2], ARGV[3], 'GT')
outbox(KEYS[3], KEYS[4], ARGV[6], ARGV[7])('TokenRestored', 'user', ARGV[2], 'token', ARGV[5])
return redis.call('DEL', KEYS[1])
