-- admit.lua: one admission tick of one target. The tick is Redis server time / tick length, and each
-- tick is applied at most once: running this again within an applied tick changes nothing.
-- KEYS[1] waiting     zset: user id -> seq (admitted users stay until they collect their token)
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms)
-- KEYS[3] seq         counter: source of sequence numbers
-- KEYS[4] mark        admitted mark: a user whose seq <= mark is admitted
-- KEYS[5] tick        number of the last applied tick
-- KEYS[6] stats       hash of counters: `admitted` counts admissions
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
local n = tonumber(ARGV[2])
if last then
  n = n * math.min(tick - last, tonumber(ARGV[3]))
end
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

-- Sliding TTL: a queue the pump still visits stays alive.
for _, i in ipairs({1, 2, 3, 4, 6}) do
  redis.call('PEXPIRE', KEYS[i], idle)
end
return {tick, admitted, tonumber(mark), waiting - admitted, now}
