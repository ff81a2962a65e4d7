-- status.lua: a waiting user's poll (also their heartbeat); admits them once the mark has passed their seq.
-- KEYS[1] waiting     zset: user id -> seq
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms)
-- KEYS[3] mark        admitted mark: a user whose seq <= mark is admitted
-- KEYS[4] token       this user's issued entry token, '<entry number> <grant: expiry.id>' (expires with it)
-- KEYS[5] stats       hash of counters: wait_count, wait_ms; `rate`: admissions per second measured by the pump
-- KEYS[6] waits       hash: wait-time histogram bucket -> users admitted with such a wait
-- KEYS[7] config      hash: the target's own batch, tick_ms, opens_at_ms, known_since_ms, sold_out, paused
-- KEYS[8] prequeue    zset: user id -> arrival seq, before opening
-- KEYS[9] active      zset: user id -> expiry (ms) of their issued, unconsumed entry token
-- KEYS[10] draw       hash: `last`, the highest arrival number the opening draw placed
-- ARGV[1] user id   ARGV[2] now (ms)
-- ARGV[3] a fresh entry token's grant, stored (after the entry's number) only if this call admits the user   ARGV[4] its TTL (ms)
-- ARGV[5] its expiry (epoch ms)   ARGV[6] the user's wait so far (ms)   ARGV[7] its histogram bucket
-- ARGV[8] default batch   ARGV[9] default tick length (ms)   ARGV[10] the entry number on the caller's ticket
-- ARGV[11] idle TTL (ms)
-- ARGV[12] the flag version the caller decided by ('*': whatever the target carries)   ARGV[13] its decision (1 queue, 0 not)
-- Returns one of:
--   {'ADMITTED', 'entry number grant', issued now (0|1)}
--   {'WAITING', seq, users ahead, admissions per second, paused (0|1)}
--   {'PRE_QUEUE', arrival seq, opens at (ms)}
--   {'NOT_IN_QUEUE'}   {'OTHER_ENTRY'} (the ticket is of an earlier entry: nothing changes)   {'UNKNOWN_TARGET'}
--   {'SOLD_OUT'} (the user's place, if any, is released: counted as `sold_out_released` in stats)
--   {'OFF'} (the queue is off for this user)   {'FLAG', the target's flag version}
local user = ARGV[1]
-- The queue's switch (flags.py): a target marked with another flag version than the caller decided by sends
-- the caller to look again before anything changes; else the caller's decision stands.
-- The target's settings in one read, the switch's mark among them.
local flag, known_since, sold_out, paused, batch, tick_ms, opens_at = unpack(redis.call('HMGET', KEYS[7],
  'flag_version', 'known_since_ms', 'sold_out', 'paused', 'batch', 'tick_ms', 'opens_at_ms'))
if flag and ARGV[12] ~= '*' and flag ~= ARGV[12] then
  return {'FLAG', flag}
end
if ARGV[13] == '0' then
  return {'OFF'}
end
-- A ticket belongs to one entry. The opening draw deals the pre-queue's arrival numbers anew: within
-- them, a ticket cannot tell its entry.
local function other_entry(number)
  local ticket, current = tonumber(ARGV[10]), tonumber(number)
  if ticket == current then
    return false
  end
  local last = tonumber(redis.call('HGET', KEYS[10], 'last') or '0')
  return ticket > last or current > last
end

if not known_since then
  return {'UNKNOWN_TARGET'}
end
local held = redis.call('GET', KEYS[4])
if held then
  if other_entry(string.match(held, '^(%d+) ')) then
    return {'OTHER_ENTRY'}
  end
  return {'ADMITTED', held, 0}
end
-- Sold out: tokens already issued stay valid (above); everyone else hears it at this poll and leaves the line.
if sold_out == '1' then
  local released = math.max(redis.call('ZREM', KEYS[1], user), redis.call('ZREM', KEYS[8], user))
  redis.call('ZREM', KEYS[2], user)
  if released == 1 then
    redis.call('HINCRBY', KEYS[5], 'sold_out_released', 1)
  end
  return {'SOLD_OUT'}
end

local seq_text = redis.call('ZSCORE', KEYS[1], user)
local seq = tonumber(seq_text)
if not seq then
  local arrival = redis.call('ZSCORE', KEYS[8], user)
  if arrival and other_entry(arrival) then
    return {'OTHER_ENTRY'}
  elseif arrival then
    return {'PRE_QUEUE', arrival, opens_at}
  end
  return {'NOT_IN_QUEUE'}
end
if other_entry(seq) then
  return {'OTHER_ENTRY'}
end
local mark_text = redis.call('GET', KEYS[3]) or '0'
local mark = tonumber(mark_text)
if seq <= mark then
  held = seq .. ' ' .. ARGV[3]
  redis.call('SET', KEYS[4], held, 'PX', ARGV[4])
  redis.call('ZREM', KEYS[1], user)
  redis.call('ZREM', KEYS[2], user)
  redis.call('ZADD', KEYS[9], ARGV[5], user)
  redis.call('HINCRBY', KEYS[5], 'wait_count', 1)
  redis.call('HINCRBY', KEYS[5], 'wait_ms', ARGV[6])
  redis.call('HINCRBY', KEYS[6], ARGV[7], 1)
  -- Keys an admission may create expire like the rest of the queue (the pump slides them while it visits).
  for _, i in ipairs({5, 6, 9}) do
    redis.call('PEXPIRE', KEYS[i], ARGV[11], 'NX')
  end
  return {'ADMITTED', held, 1}
end
redis.call('ZADD', KEYS[2], ARGV[2], user)
-- Users ahead are those not yet admitted with a smaller seq (admitted ones still collecting do not count).
-- The bounds as Redis spelt them: a Lua number turned back into text costs a printf.
local ahead = redis.call('ZCOUNT', KEYS[1], '(' .. mark_text, '(' .. seq_text)
local rate = redis.call('HGET', KEYS[5], 'rate')
  or tostring(tonumber(batch or ARGV[8]) * 1000 / tonumber(tick_ms or ARGV[9]))
return {'WAITING', seq, ahead, rate, paused == '1' and 1 or 0}
