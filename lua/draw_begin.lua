-- draw_begin.lua: begin the opening draw of a target's pre-queue, or find the one already begun.
-- KEYS[1] draw        hash: opens_at_ms, seed, state ('drawing' | 'done'), placed, drawn_at_ms, and `last`: the
--                     highest arrival number in the pre-queue (the draw deals the numbers up to it anew)
-- KEYS[2] config      hash: the target's own configuration (opens_at_ms)
-- KEYS[3] prequeue    zset: user id -> arrival seq (it no longer grows once the draw is begun)
-- ARGV[1] a fresh seed, used only if no draw was begun for this opening
-- Once begun, enter.lua sends newcomers into line behind the pre-queue, never into it.
-- Returns {the draw's seed, done (0|1)}
local opens_at = redis.call('HGET', KEYS[2], 'opens_at_ms')
local draw = redis.call('HMGET', KEYS[1], 'opens_at_ms', 'seed', 'state')
if draw[1] == opens_at and draw[2] then
  return {draw[2], draw[3] == 'done' and 1 or 0}
end
redis.call('DEL', KEYS[1])
local highest = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')[2] or '0'
redis.call('HSET', KEYS[1], 'opens_at_ms', opens_at, 'seed', ARGV[1], 'state', 'drawing', 'last', highest)
-- The record expires with the pre-queue it draws from (the pump slides both while it visits the target).
local ttl = redis.call('PTTL', KEYS[3])
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return {ARGV[1], 0}
