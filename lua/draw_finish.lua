-- draw_finish.lua: close the opening draw; the pump admits from the next tick.
-- KEYS[1] draw        hash: the draw's record
-- KEYS[2] prequeue    zset: everyone in it has been placed
-- ARGV[1] how many were placed   ARGV[2] now (ms)
if redis.call('HGET', KEYS[1], 'state') == 'drawing' then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[1], 'state', 'done', 'placed', ARGV[1], 'drawn_at_ms', ARGV[2])
end
return 1
