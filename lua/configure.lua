-- configure.lua: replace a target's own configuration in one step, so no tick sees half of it. This is what
-- opens a target: it exists (enter, status and purchases are served) once its config hash holds `known_since_ms`.
-- The configuration carries no TTL: it is the operator's, kept until replaced. Its flag_version (the switch's
-- mark, written by flag_sync) is not the operator's and stays.
-- KEYS[1] config      hash: batch, tick_ms, max_waiting, max_active, opens_at_ms, closes_at_ms, paused, sold_out,
--                     invite_only, slo_p95_ms, slo_error_rate (all optional), known_since_ms (kept from the first
--                     opening)
-- KEYS[2] events      the target's outbox stream (outbox.lua): TargetConfigChanged (with the new configuration),
--                     and TargetPaused, TargetResumed, TargetSoldOut when those fields change
-- KEYS[3] stats       the target's counters (the outbox's dropped count)
-- ARGV[1] now_ms         now (ms)
-- ARGV[2] outbox_cap     outbox cap (events)
-- ARGV[3] outbox_ttl_ms  outbox TTL (ms)
-- ARGV[4..] settings    field, value, field, value, ... (none: back to the global defaults)
-- Returns 1.
local config, events, stats = unpack(KEYS)
local now_ms, outbox_cap, outbox_ttl_ms = unpack(ARGV)
local emit = outbox(events, stats, outbox_cap, outbox_ttl_ms)
local before = redis.call('HMGET', config, 'known_since_ms', 'paused', 'sold_out', 'flag_version')
local known_since = before[1] or now_ms
redis.call('DEL', config)
redis.call('HSET', config, 'known_since_ms', known_since, unpack(ARGV, 4))
if before[4] then
  redis.call('HSET', config, 'flag_version', before[4])
end
local after = redis.call('HMGET', config, 'paused', 'sold_out')
emit('TargetConfigChanged', unpack(ARGV, 4))
if (before[2] == '1') ~= (after[1] == '1') then
  emit(after[1] == '1' and 'TargetPaused' or 'TargetResumed', 'by', 'operator')
end
if after[2] == '1' and before[3] ~= '1' then
  emit('TargetSoldOut', 'by', 'operator')
end
return 1
