-- configure.lua: replace a target's own configuration in one step, so no tick sees half of it, if the stored
-- version is what the operator expects (If-Match, If-None-Match: checked and written in one step, so two
-- operators' writes never interleave). This is what opens a target: it exists (enter, status and purchases are
-- served) once its config hash holds `known_since_ms`. The configuration carries no TTL: it is the operator's,
-- kept until replaced. Its flag_version (the switch's mark, written by flag_sync) is not the operator's and stays.
-- The version (the API's ETag) is the SHA-1 of the operator's fields, every field but those two, as sorted
-- 'field=value' lines joined by newlines (chalicelib/store.py computes the same for GET).
-- KEYS[1] config      hash: batch, tick_ms, max_waiting, max_active, opens_at_ms, closes_at_ms, paused, sold_out,
--                     invite_only, slo_p95_ms, slo_error_rate (all optional), known_since_ms (kept from the first
--                     opening)
-- KEYS[2] events      the target's outbox stream (outbox.lua): TargetConfigChanged (with the new configuration),
--                     and TargetPaused, TargetResumed, TargetSoldOut when those fields change
-- KEYS[3] stats       the target's counters (the outbox's dropped count)
-- ARGV[1] now_ms         now (ms)
-- ARGV[2] expect         '' (write whatever is stored), 'open' (the target must be open), 'new' (it must not be),
--                        or 'version' followed by the versions it may have, space-separated (none: never written)
-- ARGV[3] outbox_cap     outbox cap (events)
-- ARGV[4] outbox_ttl_ms  outbox TTL (ms)
-- ARGV[5..] settings    field, value, field, value, ... (none: back to the global defaults)
-- Returns one of:
--   {'WRITTEN', version}  written; the new version
--   {'CHANGED', version}  nothing written: the stored version is another
--   {'ALREADY_OPEN', version}  nothing written: the target is open (expect 'new')
--   {'UNKNOWN_TARGET'}  nothing written: the target is not open
local config, events, stats = unpack(KEYS)
local now_ms, expect, outbox_cap, outbox_ttl_ms = unpack(ARGV)
local emit = outbox(events, stats, outbox_cap, outbox_ttl_ms)

-- Byte order, as Python sorts the same lines (Lua's own `<` on strings follows the server's locale).
local function in_byte_order(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return #a < #b
end

local function version()
  local flat = redis.call('HGETALL', config)
  local lines = {}
  for i = 1, #flat, 2 do
    if flat[i] ~= 'known_since_ms' and flat[i] ~= 'flag_version' then
      lines[#lines + 1] = flat[i] .. '=' .. flat[i + 1]
    end
  end
  table.sort(lines, in_byte_order)
  return redis.sha1hex(table.concat(lines, '\n'))
end

local before = redis.call('HMGET', config, 'known_since_ms', 'paused', 'sold_out', 'flag_version')
if expect == 'new' and before[1] then
  return {'ALREADY_OPEN', version()}
elseif expect ~= '' and expect ~= 'new' then
  if not before[1] then
    return {'UNKNOWN_TARGET'}
  end
  if expect ~= 'open' then
    local current = version()
    if not string.find(expect .. ' ', ' ' .. current .. ' ', 1, true) then
      return {'CHANGED', current}
    end
  end
end
local known_since = before[1] or now_ms
redis.call('DEL', config)
redis.call('HSET', config, 'known_since_ms', known_since, unpack(ARGV, 5))
if before[4] then
  redis.call('HSET', config, 'flag_version', before[4])
end
local after = redis.call('HMGET', config, 'paused', 'sold_out')
emit('TargetConfigChanged', unpack(ARGV, 5))
if (before[2] == '1') ~= (after[1] == '1') then
  emit(after[1] == '1' and 'TargetPaused' or 'TargetResumed', 'by', 'operator')
end
if after[2] == '1' and before[3] ~= '1' then
  emit('TargetSoldOut', 'by', 'operator')
end
return {'WRITTEN', version()}
