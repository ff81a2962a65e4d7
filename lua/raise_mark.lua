-- raise_mark.lua: record the admissions a container made by dead reckoning while Redis could not be asked
-- (chalicelib/reckoning.py): the admitted mark moves up to the highest seq it admitted, never down. Everyone ahead
-- of that seq was due by the same reckoning, so the line goes on in order, and the pump does not admit them again.
-- The ticks up to now count as applied: the reckoning stood in for them, so the pump does not make them up again.
-- KEYS[1] mark  admitted mark: a user whose seq <= mark is admitted
-- KEYS[2] tick  start time (ms) of the last applied tick
-- ARGV[1] seq          the highest seq admitted by reckoning
-- ARGV[2] tick_ms      the tick length in force (ms)
-- ARGV[3] idle_ttl_ms  idle TTL (ms)
-- Returns 1 if the mark moved, else 0.
local mark, tick = unpack(KEYS)
local seq, tick_ms, idle_ttl_ms = unpack(ARGV)
if tonumber(redis.call('GET', mark) or '0') >= tonumber(seq) then
  return 0
end
redis.call('SET', mark, seq, 'PX', idle_ttl_ms)
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local this_tick = math.floor(now / tonumber(tick_ms)) * tonumber(tick_ms)
if tonumber(redis.call('GET', tick) or '0') < this_tick then
  redis.call('SET', tick, string.format('%d', this_tick), 'PX', idle_ttl_ms)
end
return 1
