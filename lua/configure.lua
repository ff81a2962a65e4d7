-- configure.lua: replace a target's own configuration in one step, so no tick sees half of it. This is what
-- opens a target: it exists (enter, status and purchases are served) once its config hash holds `known_since_ms`.
-- KEYS[1] config      hash: batch, tick_ms, max_waiting, max_active, opens_at_ms, closes_at_ms, paused, sold_out,
--                     slo_p95_ms, slo_error_rate (all optional), known_since_ms (kept from the first opening)
-- ARGV[1] now (ms)   ARGV[2..] field, value, field, value, ... (none: back to the global defaults)
-- The configuration carries no TTL: it is the operator's, kept until replaced. Its flag_version (the switch's
-- mark, written by flag_sync) is not the operator's and stays.
local known_since = redis.call('HGET', KEYS[1], 'known_since_ms') or ARGV[1]
local flag = redis.call('HGET', KEYS[1], 'flag_version')
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'known_since_ms', known_since, unpack(ARGV, 2))
if flag then
  redis.call('HSET', KEYS[1], 'flag_version', flag)
end
return 1
