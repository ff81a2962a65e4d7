-- enter.lua: put a user in line, idempotently, or hand back what they already hold.
-- Before the target opens (config opens_at_ms), newcomers wait in the pre-queue, to be placed in a
-- fair random order at opening; once the pump began that draw, newcomers queue behind in arrival order.
-- KEYS[1] waiting     zset: user id -> seq (users in line, admitted ones until they collect their token)
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms)
-- KEYS[3] seq         counter: source of sequence numbers (pre-queue arrivals take theirs from it too)
-- KEYS[4] mark        admitted mark: a user whose seq <= mark is admitted
-- KEYS[5] token       this user's issued entry token, '<entry number> <grant: expiry.id>' (expires with it)
-- KEYS[6] registered  present while the pump knows this target
-- KEYS[7] stats       hash of counters; `rate`: admissions per second measured by the pump (absent: none yet)
-- KEYS[8] config      hash: the target's own batch, tick_ms, max_waiting, opens_at_ms, closes_at_ms, known_since_ms,
--                     sold_out, paused, flag_version (the switch's mark, flags.py)
-- KEYS[9] prequeue    zset: user id -> arrival seq, before opening
-- KEYS[10] draw       hash: opens_at_ms of the opening whose draw the pump has begun
-- KEYS[11] active     zset: user id -> expiry (ms) of their issued, unconsumed entry token
-- ARGV[1] user id   ARGV[2] now (ms)   ARGV[3] default max waiting   ARGV[4] idle TTL (ms)
-- ARGV[5] a fresh entry token's grant, stored (after the entry's number) only if this call admits the user
-- ARGV[6] its TTL (ms)   ARGV[7] its expiry (epoch ms)
-- ARGV[8] how long a registration is trusted before the next enter registers the target again (ms)
-- ARGV[9] default batch   ARGV[10] default tick length (ms)
-- ARGV[11] '1': a first enter opens a target no operator configured (VQ_TARGETS_OPEN_ON_FIRST_USE), else '0'
-- ARGV[12] the flag version the caller decided by ('*': whatever the target carries)   ARGV[13] its decision (1 queue, 0 not)
-- Returns one of:
--   {'ADMITTED', 'entry number grant', issued now (0|1)}
--   {'WAITING', seq, users ahead, admissions per second, paused (0|1), created (0|1), target needs registering (0|1)}
--   {'PRE_QUEUE', arrival seq, opens at (ms), created (0|1), target needs registering (0|1)}
--   {'FULL'}   {'CLOSED'}   {'SOLD_OUT'} (the user's place, if any, is released)
--   {'UNKNOWN_TARGET'} (nothing was written)   {'OFF'} (the queue is off for this user)
--   {'FLAG', the target's flag version} (nothing was written)
local user = ARGV[1]
local now = tonumber(ARGV[2])
local config = redis.call('HMGET', KEYS[8], 'batch', 'tick_ms', 'max_waiting', 'opens_at_ms', 'closes_at_ms',
  'known_since_ms', 'sold_out', 'paused', 'flag_version')
-- The queue's switch (flags.py): a target marked with another flag version than the caller decided by sends
-- the caller to look again before anything changes; else the caller's decision stands.
if config[9] and ARGV[12] ~= '*' and config[9] ~= ARGV[12] then
  return {'FLAG', config[9]}
end
-- An unknown target is refused even with the queue off: a direct entry token for it would buy nothing.
if not config[6] and ARGV[11] ~= '1' then
  return {'UNKNOWN_TARGET'}
end
if ARGV[13] == '0' then
  return {'OFF'}
end
if not config[6] then
  redis.call('HSET', KEYS[8], 'known_since_ms', now)
end
local held = redis.call('GET', KEYS[5])
if held then
  return {'ADMITTED', held, 0}
end
-- Sold out: tokens already issued stay valid (above), nobody else gets or keeps a place.
if config[7] == '1' then
  if math.max(redis.call('ZREM', KEYS[1], user), redis.call('ZREM', KEYS[9], user)) == 1 then
    redis.call('HINCRBY', KEYS[7], 'sold_out_released', 1)
  end
  redis.call('ZREM', KEYS[2], user)
  return {'SOLD_OUT'}
end

-- Numbers go back to Redis as the text they came in (ARGV, replies): a Lua number turned into text costs a printf.
local mark_text = redis.call('GET', KEYS[4]) or '0'
local mark = tonumber(mark_text)
local seq = tonumber(redis.call('ZSCORE', KEYS[1], user))
if seq and seq <= mark then
  held = seq .. ' ' .. ARGV[5]
  redis.call('SET', KEYS[5], held, 'PX', ARGV[6])
  redis.call('ZREM', KEYS[1], user)
  redis.call('ZREM', KEYS[2], user)
  redis.call('ZADD', KEYS[11], ARGV[7], user)
  redis.call('PEXPIRE', KEYS[11], ARGV[4], 'NX')
  return {'ADMITTED', held, 1}
end

local arrival = tonumber(redis.call('ZSCORE', KEYS[9], user))
local created = 0
local ahead
if not seq and not arrival then
  local closes_at = tonumber(config[5])
  if closes_at and now >= closes_at then
    return {'CLOSED'}
  end
  -- Only users not yet admitted take up capacity; a newcomer has every one of those in line ahead.
  ahead = redis.call('ZCOUNT', KEYS[1], '(' .. mark_text, '+inf')
  if ahead + redis.call('ZCARD', KEYS[9]) >= tonumber(config[3] or ARGV[3]) then
    return {'FULL'}
  end
  local number = redis.call('INCR', KEYS[3])
  local opens_at = tonumber(config[4])
  if opens_at and now < opens_at and redis.call('HGET', KEYS[10], 'opens_at_ms') ~= config[4] then
    arrival = number
    redis.call('ZADD', KEYS[9], arrival, user)
  else
    seq = number
    redis.call('ZADD', KEYS[1], seq, user)
  end
  created = 1
end
if seq then
  redis.call('ZADD', KEYS[2], ARGV[2], user)
end

-- Not sliding: should the registration itself be lost, an enter within ARGV[8] ms registers again.
local register = 0
if redis.call('SET', KEYS[6], '1', 'NX', 'PX', ARGV[8]) then
  register = 1
  -- Sliding TTL, refreshed by the pump every tick and here at each registration (so at least once a
  -- minute while people arrive, and on the very first entry): a queue nobody enters and no pump visits
  -- cleans itself up. Not on every entry: five PEXPIREs would be a third of a newcomer's cost.
  for _, i in ipairs({1, 2, 3, 4, 9}) do
    redis.call('PEXPIRE', KEYS[i], ARGV[4])
  end
end
if not seq then
  return {'PRE_QUEUE', arrival, config[4], created, register}
end
ahead = ahead or redis.call('ZCOUNT', KEYS[1], '(' .. mark_text, '(' .. seq)
local rate = redis.call('HGET', KEYS[7], 'rate')
  or tostring(tonumber(config[1] or ARGV[9]) * 1000 / tonumber(config[2] or ARGV[10]))
return {'WAITING', seq, ahead, rate, config[8] == '1' and 1 or 0, created, register}
