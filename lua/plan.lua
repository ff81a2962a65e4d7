-- plan.lua: record one tick's plan of a sharded line on its sub-line 0 (docs/sharding.md), unless a plan for this
-- tick or a later one is recorded already: overlapping pumps then all apply the one recorded first.
-- KEYS[1] plan     hash: the last plan: `tick_ms` (its tick's start), `cutoff` (the highest seq any plan admitted),
--                  `carry` (a fraction of a user left to the next tick), and per sub-line, comma-separated in order,
--                  `shares` (users to admit) and `throughs` (the highest seq the share reaches)
-- ARGV[1] tick_ms      the tick's start (ms)
-- ARGV[2] cutoff       the highest seq admitted
-- ARGV[3] carry        the fraction carried
-- ARGV[4] shares       per sub-line, users to admit
-- ARGV[5] throughs     per sub-line, the highest seq to admit
-- ARGV[6] idle_ttl_ms  idle TTL (ms)
-- Returns the plan in force (field, value, ...)
local plan = unpack(KEYS)
local tick_ms, cutoff, carry, shares, throughs, idle_ttl_ms = unpack(ARGV)
local recorded = tonumber(redis.call('HGET', plan, 'tick_ms') or '0')
if recorded < tonumber(tick_ms) then
  redis.call('HSET', plan, 'tick_ms', tick_ms, 'cutoff', cutoff, 'carry', carry, 'shares', shares, 'throughs',
    throughs)
  redis.call('PEXPIRE', plan, idle_ttl_ms)
end
return redis.call('HGETALL', plan)
