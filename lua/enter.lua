-- enter.lua: put a user in line, idempotently, or hand back what they already hold.
-- KEYS[1] waiting     zset: user id -> seq (users in line, admitted ones until they collect their token)
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms)
-- KEYS[3] seq         counter: source of sequence numbers
-- KEYS[4] mark        admitted mark: a user whose seq <= mark is admitted
-- KEYS[5] token       this user's issued entry token (expires with it)
-- KEYS[6] registered  present while the pump knows this target
-- KEYS[7] stats       hash of counters; `rate`: admissions per second measured by the pump (absent: none yet)
-- ARGV[1] user id   ARGV[2] now (ms)   ARGV[3] max waiting   ARGV[4] idle TTL (ms)
-- ARGV[5] a freshly minted entry token, stored only if this call admits the user   ARGV[6] its TTL (ms)
-- ARGV[7] how long a registration is trusted before the next enter registers the target again (ms)
-- Returns one of:
--   {'ADMITTED', token, issued now (0|1)}
--   {'WAITING', seq, users ahead, measured rate or false, created (0|1), target needs registering (0|1)}
--   {'FULL'}
local user = ARGV[1]
local held = redis.call('GET', KEYS[5])
if held then
  return {'ADMITTED', held, 0}
end

local mark = tonumber(redis.call('GET', KEYS[4]) or '0')
local seq = tonumber(redis.call('ZSCORE', KEYS[1], user))
local created = 0
if not seq then
  -- Only users not yet admitted take up capacity.
  if redis.call('ZCOUNT', KEYS[1], '(' .. mark, '+inf') >= tonumber(ARGV[3]) then
    return {'FULL'}
  end
  seq = redis.call('INCR', KEYS[3])
  redis.call('ZADD', KEYS[1], seq, user)
  created = 1
elseif seq <= mark then
  redis.call('SET', KEYS[5], ARGV[5], 'PX', ARGV[6])
  redis.call('ZREM', KEYS[1], user)
  redis.call('ZREM', KEYS[2], user)
  return {'ADMITTED', ARGV[5], 1}
end
redis.call('ZADD', KEYS[2], ARGV[2], user)

-- Sliding TTL: a queue nobody enters and no pump visits cleans itself up.
local idle = ARGV[4]
for i = 1, 4 do
  redis.call('PEXPIRE', KEYS[i], idle)
end
-- Not sliding: should the registration itself be lost, an enter within ARGV[7] ms registers again.
local register = 0
if redis.call('SET', KEYS[6], '1', 'NX', 'PX', ARGV[7]) then
  register = 1
end
local ahead = redis.call('ZCOUNT', KEYS[1], '(' .. mark, '(' .. seq)
return {'WAITING', seq, ahead, redis.call('HGET', KEYS[7], 'rate'), created, register}
