-- observe_purchase.lua: note how the shop answered one forwarded purchase, for the pump to follow its health
-- (adjust_rate.lua) and for stats. A shop answering `X-Queue-Sold-Out: true` marks the target sold out.
-- KEYS[1] config      hash: known_since_ms (an unknown target gets nothing written); `sold_out` is set here
-- KEYS[2] purchases   list of 'sent at (ms):latency (ms):ok (1|0)', newest first, at most max_purchases
-- KEYS[3] stats       hash of counters: `orders` counts purchases the shop accepted (2xx)
-- KEYS[4] events      the target's outbox stream (outbox.lua): PurchaseCompleted or PurchaseFailed (with an entry
--                     token only), TargetSoldOut
-- KEYS[5] registered  present while the pump knows this target (enter.lua): the pump must publish these events
-- ARGV[1] sent_ms                   when the purchase was sent (ms)
-- ARGV[2] latency_ms                its latency (ms)
-- ARGV[3] ok                        1: the shop answered below 500; 0: a 5xx or no answer (an error against
--                                   originSlo.errorRate)
-- ARGV[4] accepted                  1: the shop accepted the order (2xx)
-- ARGV[5] sold_out                  1: the shop said sold out
-- ARGV[6] max_purchases             most samples kept
-- ARGV[7] purchases_ttl_ms          TTL of the samples and stats (ms)
-- ARGV[8] token_id                  the entry token's id ('' without one: the queue was off)
-- ARGV[9] user_id                   its user id
-- ARGV[10] status                   the shop's status (0: no answer)
-- ARGV[11] outbox_cap               outbox cap (events)
-- ARGV[12] outbox_ttl_ms            outbox TTL (ms)
-- ARGV[13] registration_refresh_ms  registration refresh (ms)
-- Returns {noted, register}: 0 (unknown target: nothing written), 1 (noted) or 2 (noted, and this answer marked
-- the target sold out); the target needs registering (0|1)
local config, purchases, stats, events, registered = unpack(KEYS)
local sent_ms, latency_ms, ok, accepted, sold_out, max_purchases, purchases_ttl_ms, token_id, user_id, status,
  outbox_cap, outbox_ttl_ms, registration_refresh_ms = unpack(ARGV)
if not redis.call('HGET', config, 'known_since_ms') then
  return {0, 0}
end
local emit = outbox(events, stats, outbox_cap, outbox_ttl_ms)
if token_id ~= '' then
  emit(accepted == '1' and 'PurchaseCompleted' or 'PurchaseFailed', 'user', user_id, 'token', token_id, 'status', status)
end
local noted = 1
if sold_out == '1' and redis.call('HSETNX', config, 'sold_out', '1') == 1 then
  emit('TargetSoldOut', 'by', 'shop')
  noted = 2
end
redis.call('LPUSH', purchases, sent_ms .. ':' .. latency_ms .. ':' .. ok)
redis.call('LTRIM', purchases, 0, tonumber(max_purchases) - 1)
redis.call('PEXPIRE', purchases, purchases_ttl_ms)
if accepted == '1' then
  redis.call('HINCRBY', stats, 'orders', 1)
  -- The pump keeps `stats` alive while users wait; a purchase after the line emptied must not leave it forever.
  if redis.call('PTTL', stats) < 0 then
    redis.call('PEXPIRE', stats, purchases_ttl_ms)
  end
end
-- As enter.lua does: a target the pump forgot (its line empty) is registered again, at most once per
-- registration_refresh_ms, so that its publisher finds these events. With events off there is nothing to publish,
-- nothing to register.
local register = 0
if outbox_cap ~= '0' and (token_id ~= '' or noted == 2)
    and redis.call('SET', registered, '1', 'NX', 'PX', registration_refresh_ms) then
  register = 1
end
return {noted, register}
