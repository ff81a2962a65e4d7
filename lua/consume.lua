-- consume.lua: use an entry token once. Exactly one of any number of concurrent calls succeeds.
-- KEYS[1] consumed   this token id's one-time marker: the id of the consumption holding it, or 'unknown' once a
--                    forwarded purchase had no certain outcome (lives the token's life plus a clock-skew margin)
-- KEYS[2] active     zset: user id -> expiry (ms) of their issued, unconsumed entry token (for maxActive)
-- KEYS[3] revoked    zset: token id -> until when (ms) it stays refused; tokens a leaving holder gave up
-- KEYS[4] config     hash: known_since_ms once an operator opened the target; paused, sold_out, closes_at_ms,
--                    shards (the line's sub-lines)
-- ARGV[1] consumption_id     a fresh consumption id, so only this consumption can settle or restore the token
-- ARGV[2] marker_ttl_ms      the marker's TTL (ms)
-- ARGV[3] user_id            the token's user id
-- ARGV[4] token_id           the token id
-- ARGV[5] open_on_first_use  '1': targets open on first use (VQ_TARGETS_OPEN_ON_FIRST_USE), so none is unknown,
--                            else '0'
-- ARGV[6] minted             how the token was minted (tokens.py's Minted): 'queue' from queue state, or without
--                            Redis: 'turn' (a ticket holder's, reckoned), 'direct' (a newcomer's)
-- ARGV[7] now_ms             now (ms)
-- ARGV[8] shards             the line's sub-lines as the caller believes, which it routed the token's user by
-- Returns 'FIRST' (this call consumed the token), 'RETRY' (it takes over a purchase of unknown outcome, to be
-- forwarded again under the same Idempotency-Key), 'USED', 'REVOKED', or, with nothing written: 'UNKNOWN_TARGET' (a
-- token minted with the queue off or Redis down names whatever target the caller asked for), 'PAUSED', 'SOLD_OUT'
-- or 'CLOSED' (a token minted without Redis, which could not tell the target's state), or 'SHARDS' (the sub-line's
-- count of sub-lines is not the caller's: it must route again).
local consumed, active, revoked, config = unpack(KEYS)
local consumption_id, marker_ttl_ms, user_id, token_id, open_on_first_use, minted, now_ms, shards = unpack(ARGV)
local known_since, paused, sold_out, closes_at, line_shards = unpack(redis.call('HMGET', config, 'known_since_ms',
  'paused', 'sold_out', 'closes_at_ms', 'shards'))
if (line_shards or '1') ~= shards then
  return 'SHARDS'
end
if open_on_first_use ~= '1' and not known_since then
  return 'UNKNOWN_TARGET'
end
-- Minted in an outage, the token could not be told the sale was held; closed only keeps newcomers out.
if minted ~= 'queue' then
  if sold_out == '1' then
    return 'SOLD_OUT'
  elseif paused == '1' then
    return 'PAUSED'
  elseif minted == 'direct' and closes_at and tonumber(now_ms) >= tonumber(closes_at) then
    return 'CLOSED'
  end
end
if redis.call('ZSCORE', revoked, token_id) then
  -- Its holder left (leave.lua). A purchase already made with it stands: one of unknown outcome may still be sent
  -- again under its key, a settled one is used; else the token was given up unused.
  local marker = redis.call('GET', consumed)
  if marker == 'unknown' then
    redis.call('SET', consumed, consumption_id, 'KEEPTTL')
    return 'RETRY'
  end
  return marker and 'USED' or 'REVOKED'
end
if redis.call('SET', consumed, consumption_id, 'NX', 'PX', marker_ttl_ms) then
  redis.call('ZREM', active, user_id)
  return 'FIRST'
end
if redis.call('GET', consumed) == 'unknown' then
  redis.call('SET', consumed, consumption_id, 'KEEPTTL')
  return 'RETRY'
end
return 'USED'
