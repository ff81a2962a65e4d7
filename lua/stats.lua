-- stats.lua: the live figures of one target, for operators. Reads only.
-- KEYS[1] waiting     zset: user id -> seq
-- KEYS[2] mark        admitted mark
-- KEYS[3] stats       hash of counters: admitted (pump), left (leave), evicted (evict), wait_count, wait_ms (status),
--                     rate (admissions per second measured by the pump while users wait)
-- KEYS[4] waits       hash: wait-time histogram bucket -> users admitted with such a wait
-- Returns {waiting not yet admitted, {stats field, value, ...}, {bucket, count, ...}}
local mark = redis.call('GET', KEYS[2]) or '0'
return {
  redis.call('ZCOUNT', KEYS[1], '(' .. mark, '+inf'),
  redis.call('HGETALL', KEYS[3]),
  redis.call('HGETALL', KEYS[4]),
}
