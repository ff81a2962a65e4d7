-- configure.lua: replace a target's own configuration in one step, so no tick sees half of it.
-- KEYS[1] config      hash: batch, tick_ms, max_waiting, max_active, opens_at_ms, closes_at_ms (all optional)
-- ARGV    field, value, field, value, ... (none: back to the global defaults)
-- The configuration carries no TTL: it is the operator's, kept until replaced.
redis.call('DEL', KEYS[1])
if #ARGV > 0 then
  redis.call('HSET', KEYS[1], unpack(ARGV))
end
return 1
