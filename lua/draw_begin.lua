-- draw_begin.lua: begin the opening draw of a target's pre-queue, or find the one already begun.
-- Once begun, enter.lua sends newcomers into line behind the pre-queue, never into it.
-- A new draw takes the seed configure.lua committed to (and takes it out of the configuration, so the next
-- opening commits to a new one); only a target configured before seeds were committed draws with a fresh one.
-- KEYS[1] draw        hash: opens_at_ms, seed, commitment (none for a fresh seed), state ('drawing' | 'done'),
--                     placed, drawn_at_ms, and `first` and `last`: the lowest and highest arrival numbers in
--                     the pre-queue (the draw deals them anew)
-- KEYS[2] config      hash: the target's own configuration (opens_at_ms, draw_seed, draw_commitment)
-- KEYS[3] prequeue    zset: user id -> arrival seq (it no longer grows once the draw is begun)
-- ARGV[1] fresh_seed  a fresh seed, used only if no draw was begun for this opening and none was committed
-- Returns {seed, done}: the draw's seed, and whether the draw is done (0|1)
local draw, config, prequeue = unpack(KEYS)
local fresh_seed = unpack(ARGV)
local opens_at, committed_seed, commitment = unpack(redis.call('HMGET', config, 'opens_at_ms', 'draw_seed',
  'draw_commitment'))
local draw_record = redis.call('HMGET', draw, 'opens_at_ms', 'seed', 'state')
if draw_record[1] == opens_at and draw_record[2] then
  return {draw_record[2], draw_record[3] == 'done' and 1 or 0}
end
redis.call('DEL', draw)
local lowest = redis.call('ZRANGE', prequeue, 0, 0, 'WITHSCORES')[2] or '0'
local highest = redis.call('ZRANGE', prequeue, -1, -1, 'WITHSCORES')[2] or '0'
local seed = committed_seed or fresh_seed
redis.call('HSET', draw, 'opens_at_ms', opens_at, 'seed', seed, 'state', 'drawing', 'first', lowest, 'last',
  highest)
if committed_seed then
  redis.call('HSET', draw, 'commitment', commitment)
  redis.call('HDEL', config, 'draw_seed', 'draw_commitment')
end
-- The record expires with the pre-queue it draws from (the pump slides both while it visits the target).
local ttl = redis.call('PTTL', prequeue)
if ttl > 0 then
  redis.call('PEXPIRE', draw, ttl)
end
return {seed, 0}
