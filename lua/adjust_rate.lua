-- adjust_rate.lua: once per tick, set how many users per tick a target with an originSlo admits, from its shop's
-- recent purchases: a multiplicative decrease while their p95 latency or error share is over the objective, an
-- additive increase back towards the configured batch while within. The configured batch stays the ceiling.
-- After a decrease, only purchases sent after it are judged, and the next decrease waits ARGV[6] ms: earlier
-- purchases describe the earlier rate.
-- KEYS[1] config    hash: batch, tick_ms, slo_p95_ms, slo_error_rate (without an originSlo nothing is kept)
-- KEYS[2] health    hash: batch (users per tick allowed), tick (start (ms) of the tick last adjusted),
--                   decreased_at (ms); admit.lua reads `batch` and keeps `carry` here
-- KEYS[3] samples   list of 'sent at (ms):latency (ms):ok (1|0)', newest first (observe_purchase.lua)
-- ARGV[1] default tick length (ms)   ARGV[2] default batch   ARGV[3] window of recent purchases (ms)
-- ARGV[4] fewest purchases to judge by   ARGV[5] increase per second, as a share of the batch
-- ARGV[6] least time between decreases (ms)   ARGV[7] deepest decrease (factor)   ARGV[8] gentlest decrease (factor)
-- ARGV[9] floor, as a share of the batch   ARGV[10] TTL of the health hash (ms)
-- Returns {users per tick allowed (string), p95 latency (ms) or -1, error share (string) or '-1', purchases judged}
-- (an empty reply without an originSlo, and {} when this tick was already adjusted).
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
local decreased_at = tonumber(health[3] or '0')

local since = math.max(now - tonumber(ARGV[3]), decreased_at)
local latencies, errors = {}, 0
for _, sample in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  local sent, latency, ok = string.match(sample, '^(%d+):(%d+):(%d)$')
  if sent and tonumber(sent) > since then
    latencies[#latencies + 1] = tonumber(latency)
    if ok == '0' then
      errors = errors + 1
    end
  end
end

local n = #latencies
local p95, error_share = -1, -1
local step = batch * tonumber(ARGV[5]) * tick_ms / 1000
if n >= tonumber(ARGV[4]) then
  table.sort(latencies)
  p95 = latencies[math.ceil(0.95 * n)]
  error_share = errors / n
  local slo_p95, slo_errors = tonumber(config[3]), tonumber(config[4])
  local slow = slo_p95 and p95 > slo_p95
  local failing = slo_errors and error_share > slo_errors
  if slow or failing then
    if now - decreased_at >= tonumber(ARGV[6]) then
      -- The further over the objective, the deeper the cut, between the gentlest and the deepest factor.
      local factor = tonumber(ARGV[8])
      if slow then
        factor = math.min(factor, math.max(tonumber(ARGV[7]), slo_p95 / p95))
      end
      if failing then
        factor = math.min(factor, math.max(tonumber(ARGV[7]), 1 - error_share))
      end
      allowed = math.max(batch * tonumber(ARGV[9]), allowed * factor)
      decreased_at = now
    end
  else
    allowed = math.min(batch, allowed + step)
  end
elseif now - decreased_at >= tonumber(ARGV[3]) then
  -- Too few purchases to judge, and no bad news for a whole window: nothing holds the rate down.
  allowed = math.min(batch, allowed + step)
end
redis.call('HSET', KEYS[2], 'batch', tostring(allowed), 'tick', tick, 'decreased_at', decreased_at)
redis.call('PEXPIRE', KEYS[2], ARGV[10])
return {tostring(allowed), p95, tostring(error_share), n}
