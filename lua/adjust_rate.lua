-- adjust_rate.lua: once per tick, set how many users per tick a target with an originSlo admits, from its shop's
-- recent purchases: a multiplicative decrease while their p95 latency or error share is over the objective, an
-- additive increase back towards the configured batch while comfortably within (under a share, ARGV[12], of it),
-- and no change in between, so the rate settles below the objective rather than around it. The configured batch
-- stays the ceiling.
-- After a decrease, only purchases sent after it are judged, and the next decrease waits a while (ARGV[7]): earlier
-- purchases describe the earlier rate. A cut goes no deeper than a share (ARGV[11]) of what the shop completed meanwhile
-- (its throughput, as one purchase per admitted user): while its backlog drains, an overloaded shop still looks
-- slow, and cutting on would take the rate far below what it handles.
-- KEYS[1] config    hash: batch, tick_ms, slo_p95_ms, slo_error_rate (without an originSlo nothing is kept)
-- KEYS[2] health    hash: batch (users per tick allowed), tick (start (ms) of the tick last adjusted),
--                   decreased_at (ms); admit.lua reads `batch` and keeps `carry` here
-- KEYS[3] samples   list of 'sent at (ms):latency (ms):ok (1|0)', newest first (observe_purchase.lua)
-- ARGV[1] default tick length (ms)   ARGV[2] default batch   ARGV[3] TTL of the health hash (ms)
-- ARGV[4..12] how to follow (chalicelib/shop_health.py's FollowRules): window of recent purchases (ms), fewest
-- purchases to judge by, increase per second as a share of the batch, least time between decreases (ms), deepest
-- and gentlest decrease (factors), floor as a share of the batch, share of the shop's throughput a cut keeps
-- ARGV[12] the share of the objective under which the rate may grow
-- Returns {users per tick allowed (string), p95 latency (ms) or -1, error share (string) or '-1', purchases judged}
-- (an empty reply without an originSlo, and {} when this tick was already adjusted).
local window, fewest, increase, hold = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local deepest, gentlest, floor, kept = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local headroom = tonumber(ARGV[12])
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
local health = redis.call('HMGET', KEYS[2], 'batch', 'tick', 'decreased_at')
if health[2] and tonumber(health[2]) >= tick then
  return {}
end
local allowed = math.min(batch, tonumber(health[1] or batch))
local before = allowed
local decreased_at = tonumber(health[3] or '0')

local since = math.max(now - window, decreased_at)
local latencies, errors, completed = {}, 0, 0
for _, sample in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local sent, latency, ok = string.match(sample, '^(%d+):(%d+):(%d)$')
  sent, latency = tonumber(sent), tonumber(latency)
  if sent and sent > since then
    latencies[#latencies + 1] = latency
    if ok == '0' then
      errors = errors + 1
    end
  end
  -- The shop's throughput: purchases it completed within the window, whenever they were sent.
  if sent and ok == '1' and sent + latency > now - window then
    completed = completed + 1
  end
end

local n = #latencies
local p95, error_share = -1, -1
local step = batch * increase * tick_ms / 1000
if n >= fewest then
  table.sort(latencies)
  p95 = latencies[math.ceil(0.95 * n)]
  error_share = errors / n
  local slo_p95, slo_errors = tonumber(config[3]), tonumber(config[4])
  local slow = slo_p95 and p95 > slo_p95
  local failing = slo_errors and error_share > slo_errors
  if slow or failing then
    if now - decreased_at >= hold then
      -- The further over the objective, the deeper the cut, between the gentlest and the deepest factor.
      local factor = gentlest
      if slow then
        factor = math.min(factor, math.max(deepest, slo_p95 / p95))
      end
      if failing then
        factor = math.min(factor, math.max(deepest, 1 - error_share))
      end
      local throughput = completed * tick_ms / window
      allowed = math.min(before, math.max(batch * floor, allowed * factor, throughput * kept))
      decreased_at = now
    end
  elseif (not slo_p95 or p95 <= slo_p95 * headroom) and (not slo_errors or error_share <= slo_errors * headroom) then
    allowed = math.min(batch, allowed + step)
  end
elseif now - decreased_at >= window then
  -- Too few purchases to judge, and no bad news for a whole window: nothing holds the rate down.
  allowed = math.min(batch, allowed + step)
end
redis.call('HSET', KEYS[2], 'batch', tostring(allowed), 'tick', tick, 'decreased_at', decreased_at)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return {tostring(allowed), p95, tostring(error_share), n}
