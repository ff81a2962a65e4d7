-- stats.lua: the live figures and configuration of one target, for operators. Reads only.
-- KEYS[1] waiting     zset: user id -> seq
-- KEYS[2] mark        admitted mark
-- KEYS[3] stats       hash of counters (chalicelib/data_model.py): admitted (pump), left (leave), evicted (evict),
--                     wait_count, wait_ms (status), sold_out_released (enter, status), not_invited (enter),
--                     passed_through (enter: the safety net), orders (observe_purchase), fences (admit)
-- KEYS[4] waits       hash: wait-time histogram bucket -> users admitted with such a wait
-- KEYS[5] prequeue    zset: users waiting for the opening
-- KEYS[6] active      zset: user id -> expiry (ms) of their issued, unconsumed entry token
-- KEYS[7] config      hash: the target's own configuration
-- KEYS[8] draw        hash: the opening draw's record
-- KEYS[9] health      hash: `batch`, users per tick the shop's health allows (adjust_rate.lua)
-- KEYS[10] purchases  list of the latest forwarded purchases, 'sent at (ms):latency (ms):ok (1|0)', newest first
-- KEYS[11] tick       start time (ms) of the last tick the pump applied (admit.lua)
-- KEYS[12] pace       hash: `rate`, admissions per second measured by the pump while users wait
-- KEYS[13] fence      hash: the last failover the pump fenced (admit.lua)
-- ARGV[1] now_ms  now (ms)
-- Returns {waiting, pre_queued, active, stats, waits, config, draw, health, purchases, last_tick_ms, rate, fence}:
-- users waiting not yet admitted, pre-queued, active (admitted ones still collecting, and live unused tokens), then
-- as lists: stats field, value, ...; wait bucket, count, ...; config field, value, ...; draw field, value, ...;
-- health field, value, ...; the purchases, newest first; the last applied tick's start (ms; false: none); the
-- measured rate (false: none); and fence field, value, ...
local waiting, mark, stats, waits, prequeue, active, config, draw, health, purchases, tick, pace, fence = unpack(KEYS)
local now_ms = unpack(ARGV)
local mark_text = redis.call('GET', mark) or '0'
return {
  redis.call('ZCOUNT', waiting, '(' .. mark_text, '+inf'),
  redis.call('ZCARD', prequeue),
  redis.call('ZCOUNT', waiting, '-inf', mark_text) + redis.call('ZCOUNT', active, '(' .. now_ms, '+inf'),
  redis.call('HGETALL', stats),
  redis.call('HGETALL', waits),
  redis.call('HGETALL', config),
  redis.call('HGETALL', draw),
  redis.call('HGETALL', health),
  redis.call('LRANGE', purchases, 0, -1),
  redis.call('GET', tick),
  redis.call('HGET', pace, 'rate'),
  redis.call('HGETALL', fence),
}
