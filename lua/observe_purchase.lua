-- observe_purchase.lua: note how the shop answered one forwarded purchase, for the pump to follow its health
-- (adjust_rate.lua) and for stats. A shop answering `X-Queue-Sold-Out: true` marks the target sold out.
-- KEYS[1] config    hash: known_since_ms (an unknown target gets nothing written); `sold_out` is set here
-- KEYS[2] samples   list of 'sent at (ms):latency (ms):ok (1|0)', newest first, at most ARGV[6]
-- KEYS[3] stats     hash of counters: `orders` counts purchases the shop accepted (2xx)
-- ARGV[1] when the purchase was sent (ms)   ARGV[2] its latency (ms)
-- ARGV[3] 1: the shop answered below 500; 0: a 5xx or no answer (an error against originSlo.errorRate)
-- ARGV[4] 1: the shop accepted the order (2xx)   ARGV[5] 1: the shop said sold out   ARGV[6] most samples kept
-- ARGV[7] TTL of the samples and stats (ms)
-- KEYS[4] events      the target's outbox stream (outbox.lua): PurchaseCompleted or PurchaseFailed (with an entry
--                     token only), TargetSoldOut
-- KEYS[5] registered  present while the pump knows this target (enter.lua): the pump must publish these events
-- ARGV[8] the entry token's id ('' without one: the queue was off)   ARGV[9] its user id   ARGV[10] the shop's
-- status (0: no answer)   ARGV[11] outbox cap (events)   ARGV[12] outbox TTL (ms)   ARGV[13] registration refresh (ms)
-- Returns {0 (unknown target: nothing written), 1 (noted) or 2 (noted, and this answer marked the target sold
-- out); the target needs registering (0|1)}
if not redis.call('HGET', KEYS[1], 'known_since_ms') then
  return {0, 0}
end
local emit = outbox(KEYS[4], KEYS[3], ARGV[11], ARGV[12])
if ARGV[8] ~= '' then
  emit(ARGV[4] == '1' and 'PurchaseCompleted' or 'PurchaseFailed', 'user', ARGV[9], 'token', ARGV[8], 'status', ARGV[10])
end
local noted = 1
if ARGV[5] == '1' and redis.call('HSETNX', KEYS[1], 'sold_out', '1') == 1 then
  emit('TargetSoldOut', 'by', 'shop')
  noted = 2
end
redis.call('LPUSH', KEYS[2], ARGV[1] .. ':' .. ARGV[2] .. ':' .. ARGV[3])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[6]) - 1)
redis.call('PEXPIRE', KEYS[2], ARGV[7])
if ARGV[4] == '1' then
  redis.call('HINCRBY', KEYS[3], 'orders', 1)
  -- The pump keeps `stats` alive while users wait; a purchase after the line emptied must not leave it forever.
  if redis.call('PTTL', KEYS[3]) < 0 then
    redis.call('PEXPIRE', KEYS[3], ARGV[7])
  end
end
-- As enter.lua does: a target the pump forgot (its line empty) is registered again, at most once per ARGV[13] ms,
-- so that its publisher finds these events. With events off there is nothing to publish, nothing to register.
local register = 0
if ARGV[11] ~= '0' and (ARGV[8] ~= '' or noted == 2) and redis.call('SET', KEYS[5], '1', 'NX', 'PX', ARGV[13]) then
  register = 1
end
return {noted, register}
