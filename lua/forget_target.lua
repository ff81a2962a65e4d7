-- forget_target.lua: drop an idle target from the registry, unless an enter registered it again since
-- the pump read the registry (a new registration writes a new random nonce).
-- KEYS[1] targets  zset: target -> nonce of its latest registration (the registry the pump visits)
-- ARGV[1] target  the target to forget
-- ARGV[2] nonce   the nonce the pump read
-- Returns 1 if the target was forgotten, else 0.
local targets = unpack(KEYS)
local target, nonce = unpack(ARGV)
if tonumber(redis.call('ZSCORE', targets, target)) == tonumber(nonce) then
  return redis.call('ZREM', targets, target)
end
return 0
