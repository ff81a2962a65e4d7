-- raise_mark.lua: record the admissions a container made by dead reckoning while Redis could not be asked
-- (chalicelib/reckoning.py): the admitted mark moves up to the highest seq it admitted, never down. Everyone ahead
-- of that seq was due by the same reckoning, so the line goes on in order, and the pump does not admit them again.
-- KEYS[1] mark  admitted mark: a user whose seq <= mark is admitted
-- ARGV[1] seq          the highest seq admitted by reckoning
-- ARGV[2] idle_ttl_ms  idle TTL (ms)
-- Returns 1 if the mark moved, else 0.
local mark = unpack(KEYS)
local seq, idle_ttl_ms = unpack(ARGV)
if tonumber(redis.call('GET', mark) or '0') >= tonumber(seq) then
  return 0
end
redis.call('SET', mark, seq, 'PX', idle_ttl_ms)
return 1
