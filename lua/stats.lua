-- stats.lua: the live figures and configuration of one target, for operators. Reads only.
-- KEYS[1] waiting     zset: user id -> seq
-- KEYS[2] mark        admitted mark
-- KEYS[3] stats       hash of counters: admitted (pump), left (leave), evicted (evict), wait_count, wait_ms (status),
--                     sold_out_released (enter, status), orders (observe_purchase), rate (admissions per second
--                     measured by the pump while users wait)
-- KEYS[4] waits       hash: wait-time histogram bucket -> users admitted with such a wait
-- KEYS[5] prequeue    zset: users waiting for the opening
-- KEYS[6] active      zset: user id -> expiry (ms) of their issued, unconsumed entry token
-- KEYS[7] config      hash: the target's own configuration
-- KEYS[8] draw        hash: the opening draw's record
-- KEYS[9] health      hash: `batch`, users per tick the shop's health allows (adjust_rate.lua)
-- KEYS[10] purchases  list of the latest forwarded purchases, 'sent at (ms):latency (ms):ok (1|0)', newest first
-- ARGV[1] now (ms)
-- Returns {waiting not yet admitted, pre-queued, active, {stats field, value, ...}, {bucket, count, ...},
--          {config field, value, ...}, {draw field, value, ...}, {health field, value, ...}, {purchase, ...}}
local mark = redis.call('GET', KEYS[2]) or '0'
return {
  redis.call('ZCOUNT', KEYS[1], '(' .. mark, '+inf'),
  redis.call('ZCARD', KEYS[5]),
  redis.call('ZCOUNT', KEYS[1], '-inf', mark) + redis.call('ZCOUNT', KEYS[6], '(' .. ARGV[1], '+inf'),
  redis.call('HGETALL', KEYS[3]),
  redis.call('HGETALL', KEYS[4]),
  redis.call('HGETALL', KEYS[7]),
  redis.call('HGETALL', KEYS[8]),
  redis.call('HGETALL', KEYS[9]),
  redis.call('LRANGE', KEYS[10], 0, -1),
}
