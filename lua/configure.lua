-- configure.lua: replace a target's own configuration in one step, so no tick sees half of it, if the stored
-- version is what the operator expects (If-Match, If-None-Match: checked and written in one step, so two
-- operators' writes never interleave). This is what opens a target: it exists (enter, status and purchases are
-- served) once its config hash holds `known_since_ms`. The configuration carries no TTL: it is the operator's,
-- kept until replaced. Its flag_version (the switch's mark, written by flag_sync) is not the operator's and stays.
-- The opening's committed seed (draw_seed, and draw_commitment, its SHA-256) is not the operator's either: it is
-- drawn when a write sets a new opensAt and none is committed, and kept through every later write, so no operator
-- can pick it; the opening (admit.lua) reveals it and takes it out, so the next new opensAt commits to a new one.
-- A sharded line (docs/sharding.md) is configured sub-line by sub-line (chalicelib/store.py): the sub-lines past the
-- first take the line's seed as given, and every sub-line the pre-queue's block of seqs (draw_block), so that the
-- sub-lines draw their places alike and the places compare.
-- The version (the API's ETag) is the SHA-1 of the operator's fields, every field but those five, as sorted
-- 'field=value' lines joined by newlines (chalicelib/store.py computes the same for GET).
-- KEYS[1] config      hash: batch, tick_ms, max_waiting, max_active, opens_at_ms, closes_at_ms, paused, sold_out,
--                     invite_only, slo_p95_ms, slo_error_rate, safety_net (all optional), known_since_ms (kept from
--                     the first opening), draw_seed and draw_commitment (kept until the opening reveals them),
--                     draw_block ('first last': the pre-queue's block of seqs, as given), shards
-- KEYS[2] events      the target's outbox stream (outbox.lua): TargetConfigChanged (with the new configuration and
--                     the commitment, if any), and TargetPaused, TargetResumed, TargetSoldOut when those fields
--                     change
-- KEYS[3] stats       the target's counters (the outbox's dropped count)
-- ARGV[1] now_ms         now (ms)
-- ARGV[2] expect         '' (write whatever is stored), 'open' (the target must be open), 'new' (it must not be),
--                        or 'version' followed by the versions it may have, space-separated (none: never written)
-- ARGV[3] outbox_cap     outbox cap (events)
-- ARGV[4] outbox_ttl_ms  outbox TTL (ms)
-- ARGV[5] fresh_seed       a fresh opening seed, committed only if the configuration has an opensAt and none is
--                          committed yet
-- ARGV[6] fresh_commitment its commitment: lowercase hex of the SHA-256 of its text
-- ARGV[7] line_seed        '1': fresh_seed is the line's seed, committed as given ('': none), whatever is stored
--                          (a sub-line past the first); else '0'
-- ARGV[8] draw_block       the pre-queue's block of seqs, 'first last', for every sub-line of a sharded line ('':
--                          none: the pre-queue's first entry fixes one)
-- ARGV[9..] settings    field, value, field, value, ... (none: back to the global defaults)
-- Returns one of:
--   {'WRITTEN', version}  written; the new version
--   {'CHANGED', version}  nothing written: the stored version is another
--   {'ALREADY_OPEN', version}  nothing written: the target is open (expect 'new')
--   {'UNKNOWN_TARGET'}  nothing written: the target is not open
local config, events, stats = unpack(KEYS)
local now_ms, expect, outbox_cap, outbox_ttl_ms, fresh_seed, fresh_commitment, line_seed, draw_block = unpack(ARGV)
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

local not_the_operators = {known_since_ms = true, flag_version = true, draw_seed = true, draw_commitment = true,
  draw_block = true}

local function version()
  local flat = redis.call('HGETALL', config)
  local lines = {}
  for i = 1, #flat, 2 do
    if not not_the_operators[flat[i]] then
      lines[#lines + 1] = flat[i] .. '=' .. flat[i + 1]
    end
  end
  table.sort(lines, in_byte_order)
  return redis.sha1hex(table.concat(lines, '\n'))
end

local before = redis.call('HMGET', config, 'known_since_ms', 'paused', 'sold_out', 'flag_version', 'draw_seed',
  'draw_commitment', 'opens_at_ms')
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
redis.call('HSET', config, 'known_since_ms', known_since, unpack(ARGV, 9))
if before[4] then
  redis.call('HSET', config, 'flag_version', before[4])
end
local after = redis.call('HMGET', config, 'paused', 'sold_out', 'opens_at_ms')
local seed, commitment = before[5], before[6]
if line_seed == '1' then
  seed, commitment = fresh_seed ~= '' and fresh_seed or nil, fresh_commitment
elseif not seed and after[3] and after[3] ~= before[7] then
  seed, commitment = fresh_seed, fresh_commitment
end
if draw_block ~= '' then
  redis.call('HSET', config, 'draw_block', draw_block)
end
if seed then
  redis.call('HSET', config, 'draw_seed', seed, 'draw_commitment', commitment)
  emit('TargetConfigChanged', 'commitment', commitment, unpack(ARGV, 9))
else
  emit('TargetConfigChanged', unpack(ARGV, 9))
end
if (before[2] == '1') ~= (after[1] == '1') then
  emit(after[1] == '1' and 'TargetPaused' or 'TargetResumed', 'by', 'operator')
end
if after[2] == '1' and before[3] ~= '1' then
  emit('TargetSoldOut', 'by', 'operator')
end
return {'WRITTEN', version()}
