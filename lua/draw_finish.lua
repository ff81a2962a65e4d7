-- draw_finish.lua: close the opening draw; the pump admits from the next tick.
-- KEYS[1] draw        hash: the draw's record
-- KEYS[2] prequeue    zset: everyone in it has been placed
-- KEYS[3] events      the target's outbox stream (outbox.lua): TargetOpened, with the draw's seed (and the
--                     commitment to it, if one was published)
-- KEYS[4] stats       the target's counters (the outbox's dropped count)
-- ARGV[1] placed         how many were placed
-- ARGV[2] now_ms         now (ms)
-- ARGV[3] outbox_cap     outbox cap (events)
-- ARGV[4] outbox_ttl_ms  outbox TTL (ms)
-- Returns 1.
local draw, prequeue, events, stats = unpack(KEYS)
local placed, now_ms, outbox_cap, outbox_ttl_ms = unpack(ARGV)
if redis.call('HGET', draw, 'state') == 'drawing' then
  redis.call('DEL', prequeue)
  redis.call('HSET', draw, 'state', 'done', 'placed', placed, 'drawn_at_ms', now_ms)
  local draw_record = redis.call('HMGET', draw, 'seed', 'opens_at_ms', 'commitment')
  local emit = outbox(events, stats, outbox_cap, outbox_ttl_ms)
  if draw_record[3] then
    emit('TargetOpened', 'seed', draw_record[1], 'placed', placed, 'opens_at_ms', draw_record[2] or '', 'commitment',
      draw_record[3])
  else
    emit('TargetOpened', 'seed', draw_record[1], 'placed', placed, 'opens_at_ms', draw_record[2] or '')
  end
end
return 1
