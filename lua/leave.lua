-- leave.lua: take a user out of line (or out of the pre-queue), and revoke the entry token they hold unused.
-- Idempotent. Only the ticket of the user's current entry may do it.
-- KEYS[1] waiting     zset: user id -> seq
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms)
-- KEYS[3] token       this user's issued entry token, '<entry number> <grant: expiry.id>' (expires with it)
-- KEYS[4] stats       hash of counters: `left` counts departures
-- KEYS[5] prequeue    zset: user id -> arrival seq, before opening
-- KEYS[6] active      zset: user id -> expiry (ms) of their issued, unconsumed entry token
-- KEYS[7] revoked     zset: token id -> until when (ms) it stays refused (its expiry plus the clock-skew margin)
-- KEYS[8] draw        hash: `last`, the highest arrival number the opening draw placed
-- ARGV[1] user id   ARGV[2] the entry number on the caller's ticket   ARGV[3] now (ms)   ARGV[4] clock-skew margin (ms)
-- KEYS[9] events      the target's outbox stream (outbox.lua): UserLeft
-- ARGV[5] idle TTL (ms)   ARGV[6] outbox cap (events)   ARGV[7] outbox TTL (ms)
-- Returns 1 if the user was in line, 0 if not, -1 if the ticket is of another (earlier) entry: nothing changes.
local user = ARGV[1]
local held = redis.call('GET', KEYS[3])
local number = redis.call('ZSCORE', KEYS[1], user) or redis.call('ZSCORE', KEYS[5], user)
  or (held and string.match(held, '^(%d+) '))
if number then
  -- The opening draw deals the pre-queue's arrival numbers anew: within them, a ticket cannot tell its entry.
  local ticket, current = tonumber(ARGV[2]), tonumber(number)
  local last = tonumber(redis.call('HGET', KEYS[8], 'last') or '0')
  if ticket ~= current and (ticket > last or current > last) then
    return -1
  end
end

local emit = outbox(KEYS[9], KEYS[4], ARGV[6], ARGV[7])
local removed = math.max(redis.call('ZREM', KEYS[1], user), redis.call('ZREM', KEYS[5], user))
if removed == 1 then
  redis.call('HINCRBY', KEYS[4], 'left', 1)
  redis.call('PEXPIRE', KEYS[4], ARGV[5], 'NX')
end
redis.call('ZREM', KEYS[2], user)
local expiry = redis.call('ZSCORE', KEYS[6], user)
local revoked
if held and expiry then
  -- Issued and unused: refused from now on, so leaving and entering again never holds two live tokens.
  local until_ms = tonumber(expiry) + tonumber(ARGV[4])
  revoked = string.match(held, '%.(%S+)$')
  redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', ARGV[3])
  redis.call('ZADD', KEYS[7], until_ms, revoked)
  redis.call('PEXPIREAT', KEYS[7], until_ms, 'NX')
  redis.call('PEXPIREAT', KEYS[7], until_ms, 'GT')
end
redis.call('ZREM', KEYS[6], user)
redis.call('DEL', KEYS[3])
if revoked then
  emit('UserLeft', 'user', user, 'token', revoked)
elseif removed == 1 then
  emit('UserLeft', 'user', user)
end
return removed
