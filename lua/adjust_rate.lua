-- adjust_rate.lua: once per tick, set how many users per tick a target with an originSlo admits, from its shop's
-- recent purchases: a multiplicative decrease when they near the objective, an additive increase while they keep
-- clear of it, and the configured batch as the ceiling.
-- How and why it follows the shop, state by state, with every argument: docs/origin-slo.md.
-- KEYS[1] config     hash: batch, tick_ms, slo_p95_ms, slo_error_rate (without an originSlo nothing is kept)
-- KEYS[2] health     hash: allowed (users per tick the shop's health allows), tick (start (ms) of the tick last
--                    adjusted), changed_at (ms, the last change), cut_at (ms, the last cut), capacity (the shop's
--                    throughput per tick at the last cut); admit.lua reads `allowed`
-- KEYS[3] purchases  list of 'sent at (ms):latency (ms):ok (1|0)', newest answer first (observe_purchase.lua)
-- ARGV[1] default_tick_ms  default tick length (ms)
-- ARGV[2] default_batch    default batch
-- ARGV[3] health_ttl_ms    TTL of the health hash (ms)
-- ARGV[4] window_ms        window of answered purchases (ms)
-- ARGV[5] fewest           fewest purchases to judge by
-- ARGV[6] increase         increase per change as a share of the batch
-- ARGV[7] reach_ms         how long a change takes to reach the shop (ms)
-- ARGV[8] deepest          deepest decrease (a share of the throughput)
-- ARGV[9] gentlest         gentlest decrease (a share of the throughput)
-- ARGV[10] floor           floor as a share of the batch
-- ARGV[11] headroom        share of the objective over which the rate is cut
-- ARGV[12] drain_ms        how soon a cut drains the backlog (ms)
-- ARGV[13] opening         opening share of the batch
-- ARGV[14] probe           increase near the capacity last seen as a share of the batch
-- ARGV[15] band            how far past that capacity (a share of it)
-- ARGV[16] hold_ms         how long after a cut the rate may pass that capacity (ms)
-- Returns {allowed, p95_ms, error_share, judged}: users per tick allowed (string), p95 latency (ms) or -1, error
-- share (string) or '-1', purchases judged.
-- Or an empty list: without an originSlo, and when this tick was already adjusted.
local config, health, purchases = unpack(KEYS)
local default_tick_ms, default_batch, health_ttl_ms, window_ms, fewest, increase, reach_ms, deepest, gentlest, floor,
  headroom, drain_ms, opening, probe, band, hold_ms = unpack(ARGV)
-- The rules as numbers, under their own names where no unit sets the number apart.
local window, reach, drain, hold = tonumber(window_ms), tonumber(reach_ms), tonumber(drain_ms), tonumber(hold_ms)
fewest, increase, deepest, gentlest = tonumber(fewest), tonumber(increase), tonumber(deepest), tonumber(gentlest)
floor, headroom, opening, probe, band = tonumber(floor), tonumber(headroom), tonumber(opening), tonumber(probe),
  tonumber(band)
local config_values = redis.call('HMGET', config, 'batch', 'tick_ms', 'slo_p95_ms', 'slo_error_rate')
if not config_values[3] and not config_values[4] then
  redis.call('DEL', health)
  return {}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local tick_ms = tonumber(config_values[2] or default_tick_ms)
local batch = tonumber(config_values[1] or default_batch)
local tick = math.floor(now / tick_ms) * tick_ms
local health_values = redis.call('HMGET', health, 'allowed', 'tick', 'changed_at', 'capacity', 'cut_at')
if health_values[2] and tonumber(health_values[2]) >= tick then
  return {}
end
local allowed = math.min(batch, tonumber(health_values[1] or batch * opening))
local before = allowed
local changed_at = tonumber(health_values[3] or now)
local capacity = tonumber(health_values[4] or '0')
local cut_at = tonumber(health_values[5] or '0')

local slo_p95, slo_errors = tonumber(config_values[3]), tonumber(config_values[4])
local latencies, errors, answered, since, behind_since, fresh = {}, 0, {}, now, nil, 0
for _, sample in ipairs(redis.call('LRANGE', purchases, 0, -1)) do
  local sent, latency, ok = string.match(sample, '^(%d+):(%d+):(%d)$')
  sent, latency = tonumber(sent), tonumber(latency)
  if sent then
    local recent = sent + latency > now - window
    if recent and ok == '1' then
      answered[#answered + 1] = sent + latency
      since = math.min(since, sent + latency)
    end
    if recent and slo_p95 and latency > slo_p95 * headroom then
      -- It waited past the headroom: from its sending on, the shop had more than it could do.
      behind_since = math.min(behind_since or sent, sent)
    end
    if sent > changed_at + reach then
      fresh = fresh + 1
    end
    if sent > cut_at + reach and (recent or #latencies < fewest) then
      latencies[#latencies + 1] = latency
      if ok == '0' then
        errors = errors + 1
      end
    end
  end
end

local n = #latencies
local p95, error_share = -1, -1
local step = batch * increase
if fresh >= fewest then
  table.sort(latencies)
  p95 = latencies[math.ceil(0.95 * n)]
  error_share = errors / n
  local slow = slo_p95 and p95 > slo_p95 * headroom
  local failing = slo_errors and error_share > slo_errors * headroom
  local missed = (slo_p95 and p95 > slo_p95) or (slo_errors and error_share > slo_errors)
  if (slow or failing) and (missed or allowed > capacity * gentlest) then
    -- The further past the headroom, the deeper the cut: a share of the throughput that drains the backlog's
    -- excess delay in time, or keeps the failing share out.
    local share = gentlest
    if slow then
      share = math.min(share, math.max(deepest, 1 - (p95 - slo_p95 * headroom) / drain))
    end
    if failing then
      share = math.min(share, math.max(deepest, 1 - error_share))
    end
    -- The shop's throughput per tick while it was behind: since the first purchase that waited past the
    -- headroom was sent (over at least the last `reach`, or the window's completions if they span less, as a
    -- sale starts; all of them for a cut on errors alone). Over the whole window alone, the time it kept up with
    -- what it was sent (all an opening rush had offered it) would pass for its capacity; over the last second
    -- alone, a stall would: the larger of the two (each of them no more than it did).
    local from = math.max(since, math.min(behind_since or since, now - reach))
    local completed = 0
    for _, at in ipairs(answered) do
      if at >= from then
        completed = completed + 1
      end
    end
    capacity = math.max(completed * tick_ms / math.max(tick_ms, now - from),
      #answered * tick_ms / math.max(tick_ms, now - since))
    allowed = math.max(batch * floor, math.min(before, capacity * share))
    changed_at, cut_at = now, now
  elseif not (slow or failing) and allowed < batch and (allowed < capacity or allowed >= capacity * (1 + band)
      or ((now - cut_at >= hold or (slo_p95 and p95 < slo_p95 * headroom / 2))
        and now - changed_at >= reach + window)) then
    -- Past the capacity last seen (by less than the band), only long after the last cut or far from the
    -- headroom, and each probe judged on a whole window sent at the one before.
    if allowed < capacity then
      allowed = math.max(capacity * gentlest, math.min(capacity, allowed + batch * probe))
    elseif allowed < capacity * (1 + band) then
      allowed = allowed + batch * probe
    else
      -- The nearer the headroom, the smaller the step (down to the probe): nearing it, the shop nears its capacity.
      local room = 1
      if slo_p95 then
        room = math.min(room, 1 - p95 / (slo_p95 * headroom))
      end
      if slo_errors and slo_errors > 0 then
        room = math.min(room, 1 - error_share / (slo_errors * headroom))
      end
      allowed = allowed + math.max(batch * probe, step * room)
    end
    allowed = math.min(batch, allowed)
    changed_at = now
  end
elseif now - changed_at >= reach + window then
  -- Too few purchases to judge, long after the last change: nothing holds the rate down.
  allowed = math.min(batch, allowed + step)
  changed_at = now
end
-- In full: the plateau is compared with what is read back (tostring keeps 14 digits).
redis.call('HSET', health, 'allowed', string.format('%.17g', allowed), 'tick', tick, 'changed_at', changed_at,
  'capacity', string.format('%.17g', capacity), 'cut_at', cut_at)
redis.call('PEXPIRE', health, health_ttl_ms)
return {tostring(allowed), p95, tostring(error_share), n}
