-- outbox.lua: not a script of its own. chalicelib/scripts.py puts it before every script that reports a change of
-- state, so the event is written in the same call as the change (never one without the other) and costs no
-- round trip. The publisher (chalicelib/events.py) sends each event to EventBridge and then deletes it.
-- outbox(stream, stats, cap, ttl) gives emit(detail-type, field, value, ...), which appends one event:
--   stream  the target's outbox stream; entry id = server time (ms) and a counter, which names the event
--   stats   the target's counters hash: `events_dropped` counts events the cap pushed out unpublished
--   cap     most events kept: a full stream loses its oldest (everything in it is unpublished); '0': events off
--   ttl     the stream's sliding TTL (ms), from its last event
-- Events one user can repeat at will (enter and leave again, enter and stop polling, buy and fail) have a budget of
-- half the cap: past it, the new one is dropped, so no burst of them pushes an admission or a target's event out.
local function outbox(stream, stats, cap, ttl)
  if cap == '0' then
    return function() end
  end
  -- Built here, not where this file is put before a script: enter.lua needs the outbox only for its safety net.
  local user_chatter = {UserLeft = true, UserEvicted = true, PurchaseCompleted = true, PurchaseFailed = true,
    TokenRestored = true}
  local length -- the stream's, read once per script call: an admission tick may append hundreds
  return function(kind, ...)
    local first = not length
    length = (length or redis.call('XLEN', stream)) + 1
    if user_chatter[kind] and length > math.floor(tonumber(cap) / 2) then
      length = length - 1
      redis.call('HINCRBY', stats, 'events_dropped', 1)
      redis.call('PEXPIRE', stats, ttl, 'NX')
      return
    end
    if length > tonumber(cap) then
      redis.call('HINCRBY', stats, 'events_dropped', 1)
      redis.call('PEXPIRE', stats, ttl, 'NX')
      length = tonumber(cap)
    end
    redis.call('XADD', stream, 'MAXLEN', cap, '*', 'type', kind, ...)
    if first then
      redis.call('PEXPIRE', stream, ttl)
    end
  end
end
