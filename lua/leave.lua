-- leave.lua: take a user out of line (or out of the pre-queue), and revoke the entry token they hold (unused, or
-- used by a purchase that may yet be given back). Idempotent. Only the ticket of the user's current entry may do it.
-- Leaving is final: the entry's number is recorded, so its ticket never restores the place (status.lua).
-- KEYS[1] waiting     zset: user id -> seq
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms)
-- KEYS[3] token       this user's issued entry token, '<entry number> <grant: expiry.id>' (expires with it)
-- KEYS[4] stats       hash of counters: `left` counts departures, `eta_left` those the ETA's range counts
-- KEYS[5] prequeue    zset: user id -> drawn seq, before opening
-- KEYS[6] active      zset: user id -> expiry (ms) of their issued, unconsumed entry token
-- KEYS[7] revoked     zset: token id -> until when (ms) it stays refused (its expiry plus the clock-skew margin)
-- KEYS[8] events      the target's outbox stream (outbox.lua): UserLeft
-- KEYS[9] ended       zset: user id -> seq of their last entry that ended on purpose (left, evicted)
-- KEYS[10] mark       admitted mark: a user whose seq <= mark is admitted
-- KEYS[11] config     hash: the target's own tick_ms, and shards (the line's sub-lines)
-- KEYS[12] departed   zset: user id -> server time (ms) of their last leave the ETA's range counted
-- ARGV[1] user_id               user id
-- ARGV[2] ticket_entry          the entry number on the caller's ticket
-- ARGV[3] now_ms                now (ms)
-- ARGV[4] clock_skew_margin_ms  clock-skew margin (ms)
-- ARGV[5] idle_ttl_ms           idle TTL (ms)
-- ARGV[6] outbox_cap            outbox cap (events)
-- ARGV[7] outbox_ttl_ms         outbox TTL (ms)
-- ARGV[8] default_tick_ms       default tick length (ms)
-- ARGV[9] departure_window_ms   the ETA counts at most one leave of a user in this long (ms)
-- ARGV[10] shards               the line's sub-lines as the caller believes, which it routed the user by
-- Returns 1 if the user was in line, 0 if not, -1 if the ticket is of another (earlier) entry, -2 if the sub-line's
-- count of sub-lines is not the caller's (it must route again): nothing changes.
local waiting, heartbeat, token, stats, prequeue, active, revoked, events, ended, mark, config,
  departed = unpack(KEYS)
local user_id, ticket_entry, now_ms, clock_skew_margin_ms, idle_ttl_ms, outbox_cap, outbox_ttl_ms, default_tick_ms,
  departure_window_ms, shards = unpack(ARGV)
if (redis.call('HGET', config, 'shards') or '1') ~= shards then
  return -2
end
local held = redis.call('GET', token)
local number = redis.call('ZSCORE', waiting, user_id) or redis.call('ZSCORE', prequeue, user_id)
  or (held and string.match(held, '^(%d+) '))
if number then
  if tonumber(ticket_entry) ~= tonumber(number) then
    return -1
  end
end
-- A place the store lost (a failover) ends too: the ticket's entry is recorded, whatever the store still holds.
redis.call('ZADD', ended, 'GT', number or ticket_entry, user_id)
redis.call('PEXPIRE', ended, idle_ttl_ms)

-- The ETA's range counts a leave as a departure (docs/waits.md) only from the line, before the user's turn, after
-- at least a tick there (the pump measures the time users wait tick by tick: a shorter stay weighs nothing beside
-- it), and once per user in the window: one account looping enter and leave cannot bend everyone's range.
local function departs(seq)
  local time = redis.call('TIME')
  local server_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local tick_ms = tonumber(redis.call('HGET', config, 'tick_ms') or default_tick_ms)
  -- Time since the seq: for a seq from the clock, the time in line; for a place drawn in the pre-queue, since its
  -- block began (the pre-queue's age at most).
  if seq <= tonumber(redis.call('GET', mark) or '0') or server_ms - seq / 1000 < tick_ms then
    return false
  end
  local since = server_ms - tonumber(departure_window_ms)
  if tonumber(redis.call('ZSCORE', departed, user_id) or since) > since then
    return false
  end
  redis.call('ZREMRANGEBYSCORE', departed, '-inf', since)
  redis.call('ZADD', departed, server_ms, user_id)
  redis.call('PEXPIRE', departed, departure_window_ms)
  return true
end

local emit = outbox(events, stats, outbox_cap, outbox_ttl_ms)
local in_line = redis.call('ZREM', waiting, user_id)
local removed = math.max(in_line, redis.call('ZREM', prequeue, user_id))
if removed == 1 then
  redis.call('HINCRBY', stats, 'left', 1)
  if in_line == 1 and departs(tonumber(number)) then
    redis.call('HINCRBY', stats, 'eta_left', 1)
  end
  redis.call('PEXPIRE', stats, idle_ttl_ms, 'NX')
end
redis.call('ZREM', heartbeat, user_id)
local expires_s, revoked_id
if held then
  expires_s, revoked_id = string.match(held, ' (%d+)%.(%S+)$')
end
if revoked_id then
  -- Refused from now on, so leaving and entering again never holds two live tokens, and a token a purchase used
  -- is not given back (restore.lua) once its holder left.
  local until_ms = tonumber(expires_s) * 1000 + tonumber(clock_skew_margin_ms)
  redis.call('ZREMRANGEBYSCORE', revoked, '-inf', now_ms)
  redis.call('ZADD', revoked, until_ms, revoked_id)
  redis.call('PEXPIREAT', revoked, until_ms, 'NX')
  redis.call('PEXPIREAT', revoked, until_ms, 'GT')
end
redis.call('ZREM', active, user_id)
redis.call('DEL', token)
if revoked_id then
  emit('UserLeft', 'user', user_id, 'token', revoked_id)
elseif removed == 1 then
  emit('UserLeft', 'user', user_id)
end
return removed
