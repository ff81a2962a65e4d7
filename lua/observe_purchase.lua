-- observe_purchase.lua: note how the shop answered one forwarded purchase, for the pump to follow its health
-- (adjust_rate.lua) and for stats. A shop answering `X-Queue-Sold-Out: true` marks the target sold out.
-- KEYS[1] config    hash: known_since_ms (an unknown target gets nothing written); `sold_out` is set here
-- KEYS[2] samples   list of 'sent at (ms):latency (ms):ok (1|0)', newest first, at most ARGV[6]
-- KEYS[3] stats     hash of counters: `orders` counts purchases the shop accepted (2xx)
-- ARGV[1] when the purchase was sent (ms)   ARGV[2] its latency (ms)
-- ARGV[3] 1: the shop answered below 500; 0: a 5xx or no answer (an error against originSlo.errorRate)
-- ARGV[4] 1: the shop accepted the order (2xx)   ARGV[5] 1: the shop said sold out   ARGV[6] most samples kept
-- ARGV[7] TTL of the samples and stats (ms)
-- Returns 0 (unknown target: nothing written), 1 (noted), 2 (noted, and this answer marked the target sold out)
if not redis.call('HGET', KEYS[1], 'known_since_ms') then
  return 0
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
if ARGV[5] == '1' and redis.call('HSETNX', KEYS[1], 'sold_out', '1') == 1 then
  return 2
end
return 1
