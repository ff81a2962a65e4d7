-- front.lua: the pump's read of one sub-line of a sharded line (docs/sharding.md), to plan the tick from: what the
-- sub-line last applied, its counts and hold, and the seqs at its front. Writes nothing.
-- KEYS[1] waiting   zset: user id -> seq (admitted users stay until they collect their token)
-- KEYS[2] mark      admitted mark of this sub-line: a user whose seq <= mark is admitted
-- KEYS[3] tick      start time (ms) of the last tick this sub-line applied
-- KEYS[4] config    hash: batch, tick_ms, max_active, paused, sold_out, opens_at_ms, slo_p95_ms, slo_error_rate,
--                   shards
-- KEYS[5] active    zset: user id -> expiry (ms) of their issued, unconsumed entry token
-- KEYS[6] draw      hash: opens_at_ms and state ('done' once the opening made the pre-queue the line)
-- KEYS[7] health    hash: `allowed`, the users per tick the shop's health allows (read with an originSlo)
-- KEYS[8] plan      hash: the last plan recorded (plan.lua); sub-line 0's only
-- ARGV[1] catchup_ticks    catch-up cap (ticks): bounds how many seqs the front answers
-- ARGV[2] default_tick_ms  default tick length (ms)
-- ARGV[3] default_batch    default batch
-- Returns {server_ms, last_tick_ms, mark, waiting, collecting, active, held, opening, shards, tick_ms, batch,
--   max_active, per_tick, seqs, plan}: server time (ms), the last applied tick (0: none), the mark, users waiting
--   not yet admitted, admitted ones not yet collecting, live tokens, paused or sold out (0 | 1 paused | 2 sold out),
--   the opening still moving its pre-queue (0|1), the configured sub-lines, tick length, batch, max active (0: none),
--   users per tick the shop's health allows (the batch without an originSlo), the first users waiting above the
--   mark (user, seq, ...): as many as the plans since this sub-line's last tick may admit, and the recorded plan
--   (field, value, ...)
local waiting, mark, tick, config, active, draw, health, plan = unpack(KEYS)
local catchup_ticks, default_tick_ms, default_batch = unpack(ARGV)
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local batch, tick_ms, max_active, paused, sold_out, opens_at, slo_p95_ms, slo_error_rate, shards = unpack(redis.call(
  'HMGET', config, 'batch', 'tick_ms', 'max_active', 'paused', 'sold_out', 'opens_at_ms', 'slo_p95_ms',
  'slo_error_rate', 'shards'))
batch = tonumber(batch or default_batch)
local per_tick = batch
if slo_p95_ms or slo_error_rate then
  per_tick = math.min(batch, tonumber(redis.call('HGET', health, 'allowed') or batch))
end
tick_ms = tonumber(tick_ms or default_tick_ms)
-- The plans since this sub-line's last tick admit at most the batch a tick, up to the cap each (two plans: one a pump
-- left unapplied here, and this tick's), and a carried fraction of a user; one tick more for a node whose clock is
-- behind sub-line 0's, whose clock numbers the plan's tick.
local last = tonumber(redis.call('GET', tick) or '0')
local behind = tonumber(catchup_ticks)
if last > 0 then
  behind = math.min(math.floor(now / tick_ms) - math.floor(last / tick_ms) + 1, 2 * behind)
end
local limit = batch * math.max(2, behind) + 1
local mark_text = redis.call('GET', mark) or '0'
local collecting = redis.call('ZCOUNT', waiting, '-inf', mark_text)
local opening = 0
if opens_at and now >= tonumber(opens_at) then
  local drawn_for, draw_state = unpack(redis.call('HMGET', draw, 'opens_at_ms', 'state'))
  if drawn_for ~= opens_at or draw_state ~= 'done' then
    opening = 1
  end
end
local held = sold_out == '1' and 2 or (paused == '1' and 1 or 0)
return {now, last, mark_text, redis.call('ZCARD', waiting) - collecting,
  collecting, redis.call('ZCOUNT', active, '(' .. now, '+inf'), held, opening, tonumber(shards or '1'),
  tick_ms, batch, tonumber(max_active or '0'), tostring(per_tick),
  redis.call('ZRANGEBYSCORE', waiting, '(' .. mark_text, '+inf', 'WITHSCORES', 'LIMIT', 0, limit),
  redis.call('HGETALL', plan)}
