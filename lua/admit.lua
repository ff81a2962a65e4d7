-- admit.lua: one admission tick of one target. The tick is Redis server time / tick length, and each
-- tick is applied at most once: running this again within an applied tick changes nothing.
-- KEYS[1] waiting     zset: user id -> seq (admitted users stay until they collect their token)
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms)
-- KEYS[3] seq         counter: source of sequence numbers
-- KEYS[4] mark        admitted mark: a user whose seq <= mark is admitted
-- KEYS[5] tick        number of the last applied tick
-- KEYS[6] stats       hash of counters: `admitted` counts admissions; `rate` is the measured admission rate
-- KEYS[7] waits       wait-time histogram (only its TTL is kept here)
-- KEYS[8] admissions  list of 'tick:admitted:ticks covered' for the last minute's ticks that left users waiting
-- ARGV[1] tick length (ms)   ARGV[2] batch (users per tick)   ARGV[3] catch-up cap (ticks)   ARGV[4] idle TTL (ms)
-- Returns {applied tick (0 if already applied), admitted now, mark, waiting not yet admitted, server time (ms)}
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local tick = math.floor(now / tonumber(ARGV[1]))
local last = tonumber(redis.call('GET', KEYS[5]))
local mark = redis.call('GET', KEYS[4]) or '0'
local collecting = redis.call('ZCOUNT', KEYS[1], '-inf', mark)
local waiting = redis.call('ZCARD', KEYS[1]) - collecting
if last and tick <= last then
  return {0, 0, tonumber(mark), waiting, now}
end

-- Ticks missed (a lapsed lock, a late pump) are made up for, up to the cap.
local covered = 1
if last then
  covered = math.min(tick - last, tonumber(ARGV[3]))
end
local n = tonumber(ARGV[2]) * covered
local admitted = math.min(n, waiting)
local idle = ARGV[4]
if admitted > 0 then
  -- Ranks follow seq, and users who left or were evicted hold no rank: the mark moves to the
  -- admitted-th user still waiting, never past the last one.
  local rank = collecting + admitted - 1
  mark = redis.call('ZRANGE', KEYS[1], rank, rank, 'WITHSCORES')[2]
  redis.call('SET', KEYS[4], mark, 'PX', idle)
  redis.call('HINCRBY', KEYS[6], 'admitted', admitted)
end
redis.call('SET', KEYS[5], tick, 'PX', idle)

-- The measured rate counts only ticks that left users waiting: a tick short of users measures demand,
-- not how fast the line moves. Running sums in `stats` keep this O(1) per tick.
if waiting - admitted > 0 then
  redis.call('LPUSH', KEYS[8], tick .. ':' .. admitted .. ':' .. covered)
  redis.call('HINCRBY', KEYS[6], 'rate_admitted', admitted)
  redis.call('HINCRBY', KEYS[6], 'rate_ticks', covered)
end
local oldest = tick - math.floor(60000 / tonumber(ARGV[1]))
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
  local per_second = tonumber(redis.call('HGET', KEYS[6], 'rate_admitted')) * 1000 / (ticks * tonumber(ARGV[1]))
  redis.call('HSET', KEYS[6], 'rate', string.format('%.3f', per_second))
else
  redis.call('HDEL', KEYS[6], 'rate')
end

-- Sliding TTL: a queue the pump still visits stays alive.
for _, i in ipairs({1, 2, 3, 4, 6, 7, 8}) do
  redis.call('PEXPIRE', KEYS[i], idle)
end
return {tick, admitted, tonumber(mark), waiting - admitted, now}
