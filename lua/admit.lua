-- admit.lua: one admission tick of one target. The tick is Redis server time / tick length, and each
-- tick is applied at most once: running this again within an applied tick changes nothing.
-- KEYS[1] waiting     zset: user id -> seq (admitted users stay until they collect their token)
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms)
-- KEYS[3] seq         counter: source of sequence numbers
-- KEYS[4] mark        admitted mark: a user whose seq <= mark is admitted
-- KEYS[5] tick        start time (ms) of the last applied tick
-- KEYS[6] stats       hash of counters: `admitted` counts admissions; `rate` is the measured admission rate
-- KEYS[7] waits       wait-time histogram (only its TTL is kept here)
-- KEYS[8] admissions  list of 'tick start (ms):admitted:ticks covered' for the last minute's ticks that left users waiting
-- KEYS[9] config      hash: the target's own batch, tick_ms, max_active, opens_at_ms, max_waiting, paused, sold_out,
--                     slo_p95_ms, slo_error_rate (else the defaults below)
-- KEYS[10] prequeue   zset: user id -> arrival seq, before opening
-- KEYS[11] draw       hash: opens_at_ms and state ('drawing' | 'done') of the opening's pre-queue draw
-- KEYS[12] active     zset: user id -> expiry (ms) of their issued, unconsumed entry token
-- KEYS[13] health     hash: `batch`, the users per tick the shop's health allows (adjust_rate.lua), and `carry`,
--                     the fraction of a user owed from earlier ticks; read only when the target has an originSlo
-- ARGV[1] default tick length (ms)   ARGV[2] default batch (users per tick)   ARGV[3] catch-up cap (ticks)
-- KEYS[14] events    the target's outbox stream (outbox.lua): UserAdmitted for each user admitted
-- ARGV[4] idle TTL (ms)   ARGV[5] outbox cap (events)   ARGV[6] outbox TTL (ms)
-- Paused or sold out (config `paused`, `sold_out`), a tick admits nobody and still counts as applied, so resuming
-- goes on at the rate rather than catching up on the pause.
-- Returns {applied tick (0 if already applied), admitted now, mark, waiting not yet admitted, server time (ms),
--          the pre-queue needs its opening draw (0|1), tick length (ms), batch, max waiting or 0, max active or 0,
--          paused (0|1), sold out (0|1), users per tick in force (the batch, less while the shop is unhealthy; 0 held)}
local emit = outbox(KEYS[14], KEYS[6], ARGV[5], ARGV[6])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local config = redis.call('HMGET', KEYS[9], 'batch', 'tick_ms', 'max_active', 'opens_at_ms', 'max_waiting', 'paused',
  'sold_out', 'slo_p95_ms', 'slo_error_rate')
local tick_ms = tonumber(config[2] or ARGV[1])
local batch = tonumber(config[1] or ARGV[2])
local held = config[6] == '1' or config[7] == '1'
local per_tick = batch
if config[8] or config[9] then
  per_tick = math.min(batch, tonumber(redis.call('HGET', KEYS[13], 'batch') or batch))
end
local settings = {tick_ms, batch, tonumber(config[5] or '0'), tonumber(config[3] or '0'),
  config[6] == '1' and 1 or 0, config[7] == '1' and 1 or 0, held and '0' or tostring(per_tick)}
local tick = math.floor(now / tick_ms)
-- Kept as a time, not a tick number, so a change of tick length never replays or skips a tick.
local last = tonumber(redis.call('GET', KEYS[5]))
local mark = redis.call('GET', KEYS[4]) or '0'
local collecting = redis.call('ZCOUNT', KEYS[1], '-inf', mark)
local waiting = redis.call('ZCARD', KEYS[1]) - collecting
if last and tick * tick_ms <= last then
  return {0, 0, tonumber(mark), waiting, now, 0, unpack(settings)}
end

local idle = ARGV[4]
-- Sliding TTL: a queue the pump still visits stays alive (its configuration is the operator's to keep).
local function keep_alive()
  for _, i in ipairs({1, 2, 3, 4, 6, 7, 8, 10, 11, 12}) do
    redis.call('PEXPIRE', KEYS[i], idle)
  end
end

-- At opening, nobody is admitted until the pre-queue has been placed in line (the pump's draw). The tick
-- counts as applied, so the line starts at the configured rate rather than catching up on the wait.
local opens_at = tonumber(config[4])
if opens_at and now >= opens_at then
  local draw = redis.call('HMGET', KEYS[11], 'opens_at_ms', 'state')
  if draw[1] ~= config[4] or draw[2] ~= 'done' then
    redis.call('SET', KEYS[5], tick * tick_ms, 'PX', idle)
    keep_alive()
    return {tick, 0, tonumber(mark), waiting, now, 1, unpack(settings)}
  end
end

-- Ticks missed (a lapsed lock, a late pump) are made up for, up to the cap.
local covered = 1
if last then
  covered = math.max(1, math.min(math.floor((tick * tick_ms - last) / tick_ms), tonumber(ARGV[3])))
end
-- Below the batch, users per tick may be fractional: the fraction carries over to the next tick.
local owed = per_tick * covered
if per_tick < batch then
  owed = owed + tonumber(redis.call('HGET', KEYS[13], 'carry') or '0')
end
local admitted = math.min(math.floor(owed), waiting)
if held then
  admitted = 0
elseif per_tick < batch then
  redis.call('HSET', KEYS[13], 'carry', admitted < waiting and tostring(owed - admitted) or '0')
end
-- maxActive: admitted users not done with their turn (still collecting, or holding a live unused token)
-- take up room.
local max_active = tonumber(config[3])
if max_active then
  redis.call('ZREMRANGEBYSCORE', KEYS[12], '-inf', now)
  local active = collecting + redis.call('ZCARD', KEYS[12])
  admitted = math.max(0, math.min(admitted, max_active - active))
end
if admitted > 0 then
  -- Ranks follow seq, and users who left or were evicted hold no rank: the mark moves to the
  -- admitted-th user still waiting, never past the last one.
  local newly = redis.call('ZRANGE', KEYS[1], collecting, collecting + admitted - 1, 'WITHSCORES')
  mark = newly[#newly]
  for i = 1, #newly, 2 do
    emit('UserAdmitted', 'user', newly[i], 'seq', newly[i + 1])
  end
  redis.call('SET', KEYS[4], mark, 'PX', idle)
  redis.call('HINCRBY', KEYS[6], 'admitted', admitted)
end
redis.call('SET', KEYS[5], tick * tick_ms, 'PX', idle)

-- The measured rate counts only ticks that left users waiting: a tick short of users measures demand,
-- not how fast the line moves. Running sums in `stats` keep this O(1) per tick.
if waiting - admitted > 0 and not held then
  redis.call('LPUSH', KEYS[8], tick * tick_ms .. ':' .. admitted .. ':' .. covered)
  redis.call('HINCRBY', KEYS[6], 'rate_admitted', admitted)
  redis.call('HINCRBY', KEYS[6], 'rate_ticks', covered)
end
local oldest = tick * tick_ms - 60000
while true do
  local entry = redis.call('LINDEX', KEYS[8], -1)
  if not entry then break end
  local at, count, ticks = string.match(entry, '^(%d+):(%d+):(%d+)$')
  if tonumber(at) > oldest then break end
  redis.call('RPOP', KEYS[8])
  redis.call('HINCRBY', KEYS[6], 'rate_admitted', -tonumber(count))
  redis.call('HINCRBY', KEYS[6], 'rate_ticks', -tonumber(ticks))
end
local ticks = tonumber(redis.call('HGET', KEYS[6], 'rate_ticks') or '0')
if ticks > 0 then
  local per_second = tonumber(redis.call('HGET', KEYS[6], 'rate_admitted')) * 1000 / (ticks * tick_ms)
  redis.call('HSET', KEYS[6], 'rate', string.format('%.3f', per_second))
else
  redis.call('HDEL', KEYS[6], 'rate')
end

keep_alive()
return {tick, admitted, tonumber(mark), waiting - admitted, now, 0, unpack(settings)}
