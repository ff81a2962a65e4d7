-- adjust_rate.lua: once per tick, set how many users per tick a target with an originSlo admits, from its shop's
-- recent purchases (AIMD): a multiplicative decrease while their p95 latency or error share is over the objective,
-- an additive increase back towards the configured batch while comfortably within (under a share, ARGV[11], of
-- it), and no change in between, so the rate settles below the objective rather than around it. The configured
-- batch stays the ceiling.
-- Every change is judged before the next: a change reaches the shop only with users admitted after it, who buy at
-- their next poll (ARGV[7]), so only purchases sent that long after the last change count, and nothing changes
-- until at least ARGV[5] of them came back (a p95 of fewer says little). Of those, the ones the shop answered
-- within the last window (ARGV[4]) are judged, or the latest ARGV[5] if fewer: a backlog shows as soon as its
-- purchases come back, and purchases of an earlier rate never cut the rate twice.
-- A cut is a share of what the shop completed in the window (its throughput, as one purchase per admitted user;
-- never more than the rate before): over the objective by E ms of p95, the shop holds about E ms of backlog, and
-- admitting 1 - E/D of its throughput drains it within D ms (ARGV[12]). So an overloaded shop is cut below what it
-- handles, not below what was sent. The share stays between the deepest and gentlest factors (ARGV[8], ARGV[9]).
-- Over its objective the shop is saturated, so that throughput is its capacity as last seen: once healthy again, the
-- rate comes back at once to the gentlest share of it, and grows on from there by small steps.
-- KEYS[1] config    hash: batch, tick_ms, slo_p95_ms, slo_error_rate (without an originSlo nothing is kept)
-- KEYS[2] health    hash: batch (users per tick allowed), tick (start (ms) of the tick last adjusted),
--                   changed_at (ms, the last change), capacity (the shop's throughput per tick at the last cut);
--                   admit.lua reads `batch` and keeps `carry` here
-- KEYS[3] samples   list of 'sent at (ms):latency (ms):ok (1|0)', newest answer first (observe_purchase.lua)
-- ARGV[1] default tick length (ms)   ARGV[2] default batch   ARGV[3] TTL of the health hash (ms)
-- ARGV[4..12] how to follow (chalicelib/shop_health.py's FollowRules): window of answered purchases (ms), fewest
-- purchases to judge by, increase per change as a share of the batch, how long a change takes to reach the shop
-- (ms), deepest and gentlest decrease (shares of the throughput), floor as a share of the batch, share of the
-- objective under which the rate may grow, how soon a cut drains the backlog (ms)
-- Returns {users per tick allowed (string), p95 latency (ms) or -1, error share (string) or '-1', purchases judged}
-- (an empty reply without an originSlo, and {} when this tick was already adjusted).
local window, fewest, increase, reach = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local deepest, gentlest, floor, headroom = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local drain = tonumber(ARGV[12])
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
local health = redis.call('HMGET', KEYS[2], 'batch', 'tick', 'changed_at', 'capacity')
if health[2] and tonumber(health[2]) >= tick then
  return {}
end
local allowed = math.min(batch, tonumber(health[1] or batch))
local before = allowed
local changed_at = tonumber(health[3] or '0')
local capacity = tonumber(health[4] or '0')

local latencies, errors, completed, since = {}, 0, 0, now
for _, sample in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local sent, latency, ok = string.match(sample, '^(%d+):(%d+):(%d)$')
  sent, latency = tonumber(sent), tonumber(latency)
  if sent then
    local recent = sent + latency > now - window
    if recent and ok == '1' then
      completed = completed + 1
      since = math.min(since, sent + latency)
    end
    if sent > changed_at + reach and (recent or #latencies < fewest) then
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
if n >= fewest then
  table.sort(latencies)
  p95 = latencies[math.ceil(0.95 * n)]
  error_share = errors / n
  local slo_p95, slo_errors = tonumber(config[3]), tonumber(config[4])
  local slow = slo_p95 and p95 > slo_p95
  local failing = slo_errors and error_share > slo_errors
  if slow or failing then
    -- The further over the objective, the deeper the cut: a share of the throughput that drains the backlog's
    -- excess delay in time, or keeps the failing share out.
    local share = gentlest
    if slow then
      share = math.min(share, math.max(deepest, 1 - (p95 - slo_p95) / drain))
    end
    if failing then
      share = math.min(share, math.max(deepest, 1 - error_share))
    end
    -- The shop's throughput per tick, over the time the window's completions span (shorter as a sale starts).
    capacity = completed * tick_ms / math.max(tick_ms, now - since)
    allowed = math.max(batch * floor, math.min(before, capacity * share))
    changed_at = now
  elseif (not slo_p95 or p95 <= slo_p95 * headroom) and (not slo_errors or error_share <= slo_errors * headroom)
      and allowed < batch then
    allowed = math.min(batch, math.max(allowed + step, capacity * gentlest))
    changed_at = now
  end
elseif now - changed_at >= reach + window then
  -- Too few purchases to judge, long after the last change: nothing holds the rate down.
  allowed = math.min(batch, allowed + step)
  changed_at = now
end
redis.call('HSET', KEYS[2], 'batch', tostring(allowed), 'tick', tick, 'changed_at', changed_at,
  'capacity', tostring(capacity))
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {tostring(allowed), p95, tostring(error_share), n}
