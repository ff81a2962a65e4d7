-- adjust_rate.lua: once per tick, set how many users per tick a target with an originSlo admits, from its shop's
-- recent purchases: a multiplicative decrease when they near the objective, an additive increase while they keep
-- clear of it, and the configured batch as the ceiling.
-- A sale opens at a share of the batch (ARGV[13]): the shop's capacity is unknown until it shows it, and a line
-- admitted at a ceiling above it fills the shop's backlog before any purchase could come back to say so.
-- Every change is judged before the next: a change reaches the shop only with users admitted after it, who buy at
-- their next poll (ARGV[7]), so nothing changes until at least ARGV[5] purchases sent that long after the last
-- change came back (a p95 of fewer says little). What is judged: the purchases the shop answered within the last
-- window (ARGV[4]), or the latest ARGV[5] if fewer, sent after the last cut reached the shop. Those sent before
-- describe a backlog already cut for, and must not cut the rate twice; slow ones sent before an increase count,
-- as they show a shop already behind (judging only those sent after it would judge its fastest: the first to
-- come back).
-- The leading edge is the headroom (ARGV[11], a share of the objective): a shop's p95 stays flat until it nears
-- its capacity, then its backlog grows for as long as a change takes to reach it, so the rate is cut as the p95
-- passes the headroom, not the objective. A cut is a share of what the shop completed while it was behind (its
-- throughput, as one purchase per admitted user; never more than the rate before): E ms of p95 over the
-- headroom is about E ms of backlog, and admitting 1 - E/D of the throughput drains it within D ms (ARGV[12]).
-- The share stays between the deepest and gentlest factors (ARGV[8], ARGV[9]). That throughput is the larger of
-- what the shop completed since the first purchase that waited past the headroom was sent (over at least the
-- last `reach`: as a sale opens, before that it did all it was sent) and over the window (a stall of a second
-- must not pass for its pace). It is the shop's capacity as last seen, and the growth follows it, as TCP CUBIC's
-- window does: healthy again, the rate comes back at once to the gentlest share of it (the plateau), and grows by
-- a probe (ARGV[14]) up to it, no further. Past it a backlog grows at the excess for as long as the rate stays,
-- and the p95 shows it only once it is there, so the rate holds at the capacity until ARGV[16] after the last cut
-- (or while the p95 stays under half the headroom: a shop that far from its capacity was seen in a dip), and
-- then grows by a probe per reach and window (each judged on a whole window sent at the one before) up to a share
-- (ARGV[15]) past it; beyond, or with no capacity seen, by the step (ARGV[6]) times the share of the headroom
-- still free (a p95 half way to it: half the step), never less than the probe. At or under the plateau and
-- within the objective, a p95 over the headroom holds the rate: there it is the shop's own pace, not a backlog.
-- KEYS[1] config    hash: batch, tick_ms, slo_p95_ms, slo_error_rate (without an originSlo nothing is kept)
-- KEYS[2] health    hash: batch (users per tick allowed), tick (start (ms) of the tick last adjusted),
--                   changed_at (ms, the last change), cut_at (ms, the last cut), capacity (the shop's throughput
--                   per tick at the last cut); admit.lua reads `batch` and keeps `carry` here
-- KEYS[3] samples   list of 'sent at (ms):latency (ms):ok (1|0)', newest answer first (observe_purchase.lua)
-- ARGV[1] default tick length (ms)   ARGV[2] default batch   ARGV[3] TTL of the health hash (ms)
-- ARGV[4..16] how to follow (chalicelib/shop_health.py's FollowRules): window of answered purchases (ms), fewest
-- purchases to judge by, increase per change as a share of the batch, how long a change takes to reach the shop
-- (ms), deepest and gentlest decrease (shares of the throughput), floor as a share of the batch, share of the
-- objective over which the rate is cut, how soon a cut drains the backlog (ms), opening share of the batch,
-- increase near the capacity last seen as a share of the batch, how far past that capacity (a share of it), how
-- long after a cut the rate may pass that capacity (ms)
-- Returns {users per tick allowed (string), p95 latency (ms) or -1, error share (string) or '-1', purchases judged}
-- (an empty reply without an originSlo, and {} when this tick was already adjusted).
local window, fewest, increase, reach = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local deepest, gentlest, floor, headroom = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local drain, opening, probe, band = tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15])
local hold = tonumber(ARGV[16])
local config = redis.call('HMGET', KEYS[1], 'batch', 'tick_ms', 'slo_p95_ms', 'slo_error_rate')
if not config[3] and not config[4] then
  redis.call('DEL', KEYS[2])
  return {}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local tick_ms = tonumber(config[2] or ARGV[1])
local batch = tonumber(config[1] or ARGV[2])
local tick = math.floor(now / tick_ms) * tick_ms
local health = redis.call('HMGET', KEYS[2], 'batch', 'tick', 'changed_at', 'capacity', 'cut_at')
if health[2] and tonumber(health[2]) >= tick then
  return {}
end
local allowed = math.min(batch, tonumber(health[1] or batch * opening))
local before = allowed
local changed_at = tonumber(health[3] or now)
local capacity = tonumber(health[4] or '0')
local cut_at = tonumber(health[5] or '0')

local slo_p95, slo_errors = tonumber(config[3]), tonumber(config[4])
local latencies, errors, answered, since, behind_since, fresh = {}, 0, {}, now, nil, 0
for _, sample in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
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
redis.call('HSET', KEYS[2], 'batch', string.format('%.17g', allowed), 'tick', tick, 'changed_at', changed_at,
  'capacity', string.format('%.17g', capacity), 'cut_at', cut_at)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {tostring(allowed), p95, tostring(error_share), n}
