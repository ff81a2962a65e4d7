-- draw_finish.lua: close the opening draw; the pump admits from the next tick.
-- KEYS[1] draw        hash: the draw's record
-- KEYS[2] prequeue    zset: everyone in it has been placed
-- KEYS[3] events      the target's outbox stream (outbox.lua): TargetOpened, with the draw's seed
-- KEYS[4] stats       the target's counters (the outbox's dropped count)
-- ARGV[1] how many were placed   ARGV[2] now (ms)   ARGV[3] outbox cap (events)   ARGV[4] outbox TTL (ms)
if redis.call('HGET', KEYS[1], 'state') == 'drawing' then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[1], 'state', 'done', 'placed', ARGV[1], 'drawn_at_ms', ARGV[2])
  local draw = redis.call('HMGET', KEYS[1], 'seed', 'opens_at_ms')
  outbox(KEYS[3], KEYS[4], ARGV[3], ARGV[4])('TargetOpened', 'seed', draw[1], 'placed', ARGV[1], 'opens_at_ms', draw[2] or '')
end
return 1
