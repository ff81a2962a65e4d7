-- forget_target.lua: drop an idle target from the registry, unless an enter registered it again since
-- the pump read the registry (a new registration writes a new random nonce).
-- KEYS[1] registry  zset: target -> nonce of its latest registration
-- ARGV[1] target    ARGV[2] the nonce the pump read
-- Returns 1 if the target was forgotten, else 0.
if tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1])) == tonumber(ARGV[2]) then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
