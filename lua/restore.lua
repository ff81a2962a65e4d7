-- restore.lua: settle a consumption whose purchase did not end in an answer from the shop it stands by.
-- 'unused': the shop certainly did not take the order (nothing was sent, or it said so): the token is whole again.
-- 'unknown': the outcome is unknown (a timeout, a 5xx): the token stays used, but a retry may take it over.
-- A marker holding another consumption id belongs to a later use, which must stand; an expired marker is gone.
-- A token whose holder left meanwhile (leave.lua revoked it) is not given back but stays refused, and none is given
-- back that would lift the target's admitted users not yet done past its maxActive: it stays used.
-- KEYS[1] consumed   this token id's one-time marker
-- KEYS[2] active     zset: user id -> expiry (ms) of their issued, unconsumed entry token (for maxActive)
-- KEYS[3] events     the target's outbox stream (outbox.lua): TokenRestored
-- KEYS[4] stats      the target's counters (the outbox's dropped count; `not_restored` counts tokens kept used)
-- KEYS[5] revoked    zset: token id -> until when (ms) it stays refused; tokens given up by a leaving holder
-- KEYS[6] config     hash: the target's own max_active
-- KEYS[7] waiting    zset: user id -> seq (admitted users still collecting count against max_active)
-- KEYS[8] mark       admitted mark
-- ARGV[1] consumption_id    the consumption id that consume.lua stored
-- ARGV[2] user_id           the token's user id
-- ARGV[3] token_expires_ms  its expiry (epoch ms)
-- ARGV[4] outcome           'unused' | 'unknown'
-- ARGV[5] token_id          the token id
-- ARGV[6] outbox_cap        outbox cap (events)
-- ARGV[7] outbox_ttl_ms     outbox TTL (ms)
-- Returns 1 if the consumption was settled, else 0 (another use holds the marker, or the token stays refused or
-- used).
local consumed, active, events, stats, revoked, config, waiting, mark = unpack(KEYS)
local consumption_id, user_id, token_expires_ms, outcome, token_id, outbox_cap, outbox_ttl_ms = unpack(ARGV)
if redis.call('GET', consumed) ~= consumption_id then
  return 0
end
if outcome == 'unknown' then
  redis.call('SET', consumed, 'unknown', 'KEEPTTL')
  return 1
end
if redis.call('ZSCORE', revoked, token_id) then
  redis.call('DEL', consumed)
  return 0
end
local max_active = tonumber(redis.call('HGET', config, 'max_active'))
if max_active then
  local time = redis.call('TIME')
  redis.call('ZREMRANGEBYSCORE', active, '-inf', tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000))
  local collecting = redis.call('ZCOUNT', waiting, '-inf', redis.call('GET', mark) or '0')
  if collecting + redis.call('ZCARD', active) >= max_active then
    redis.call('HINCRBY', stats, 'not_restored', 1)
    redis.call('PEXPIRE', stats, outbox_ttl_ms, 'NX') -- as the outbox's count: every key expires
    return 0
  end
end
redis.call('ZADD', active, token_expires_ms, user_id)
-- The pump may have let `active` expire meanwhile: a new one lives at least as long as this token.
redis.call('PEXPIREAT', active, token_expires_ms, 'NX')
redis.call('PEXPIREAT', active, token_expires_ms, 'GT')
outbox(events, stats, outbox_cap, outbox_ttl_ms)('TokenRestored', 'user', user_id, 'token', token_id)
return redis.call('DEL', consumed)
