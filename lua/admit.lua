-- admit.lua: one admission tick of one target. The tick is Redis server time / tick length, and each
-- tick is applied at most once: running this again within an applied tick changes nothing.
-- Paused or sold out (config `paused`, `sold_out`), a tick admits nobody and still counts as applied, so resuming
-- goes on at the rate rather than catching up on the pause.
-- A sub-line of a sharded line (docs/sharding.md) applies the pump's plan instead: its share of the tick, up to the
-- seq the plan's merge reached on it, at the plan's tick; the pump planned the rate, maxActive and the hold.
-- KEYS[1] waiting     zset: user id -> seq (admitted users stay until they collect their token)
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms)
-- KEYS[3] seq         the last sequence number handed out
-- KEYS[4] mark        admitted mark: a user whose seq <= mark is admitted
-- KEYS[5] tick        start time (ms) of the last applied tick
-- KEYS[6] stats       hash of counters: `admitted` counts admissions, `fences` failovers fenced;
--                     `waiting_user_ms` sums the users waiting over each tick's length (what departures are a rate of)
-- KEYS[7] waits       wait-time histogram (only its TTL is kept here)
-- KEYS[8] admissions  list of 'tick start (ms):admitted:ticks covered' for the last minute's ticks that left users
--                     waiting
-- KEYS[9] config      hash: the target's own batch, tick_ms, max_active, opens_at_ms, max_waiting, paused, sold_out,
--                     slo_p95_ms, slo_error_rate, safety_net, shards (else the defaults below); draw_seed and
--                     draw_commitment, revealed (and taken out) at the opening
-- KEYS[10] prequeue   zset: user id -> drawn seq, before opening: the line's from the opening on
-- KEYS[11] draw       hash: the opening draw's record: opens_at_ms, state ('done': opened), and the revealed seed,
--                     commitment, placed and drawn_at_ms
-- KEYS[12] active     zset: user id -> expiry (ms) of their issued, unconsumed entry token
-- KEYS[13] health     hash: `allowed`, the users per tick the shop's health allows (adjust_rate.lua); read only
--                     when the target has an originSlo
-- KEYS[14] events     the target's outbox stream (outbox.lua): UserAdmitted for each user admitted, TargetOpened
-- KEYS[15] ended      zset: user id -> seq of their last entry that ended on purpose (its records the mark passed
--                     are dropped: status.lua restores no such seq)
-- KEYS[16] budget     hash: the admissions counted against each tick (budget.lua): the safety net's since the last
--                     applied tick come out of this tick's
-- KEYS[17] pace      hash: the measured rate (`rate`, over the last minute's ticks that left users waiting, from
--                     `rate_admitted` and `rate_ticks`), and `carry`, the fraction of a user a tick below the batch
--                     leaves to the next
-- KEYS[18] fence     hash: the last failover fenced: `lost_from` and `lost_to`, the seqs it may have lost, and
--                     `until_ms`, until when status.lua restores one of them admitted; `mark`, the mark it raised the
--                     node to, and `overdraft`, the places status.lua restored admitted above it, which take the next
--                     ticks' slots
-- ARGV[1] default_tick_ms  default tick length (ms)
-- ARGV[2] default_batch    default batch (users per tick)
-- ARGV[3] catchup_ticks    catch-up cap (ticks)
-- ARGV[4] idle_ttl_ms      idle TTL (ms)
-- ARGV[5] outbox_cap       outbox cap (events)
-- ARGV[6] outbox_ttl_ms    outbox TTL (ms)
-- ARGV[7] seen_tick_ms     the last tick (its start, ms) the calling pump saw applied to this target (0: none)
-- ARGV[8] seen_mark        the mark it saw then (0: none)
-- ARGV[9] fence_margin_us  how far above the server clock a fence raises the seq (us)
-- ARGV[10] fence_window_ms how long after a fence status.lua restores an entry the mark passed among the seqs lost
-- ARGV[11] shards          the sub-lines the pump takes the line to span: another count in the config writes nothing
-- ARGV[12] share           the plan's share of this sub-line: most users to admit (-1: no plan, admit at the rate)
-- ARGV[13] through         ...none with a seq above this one
-- ARGV[14] plan_tick_ms    ...the plan's tick (its start, ms), applied at most once like any tick
-- Returns {applied_tick, admitted, mark, waiting, server_ms, needs_draw, tick_ms, batch, max_waiting, max_active,
--   paused, sold_out, per_tick, fenced_from, fenced_to, shards}:
--   applied tick (0 if already applied), admitted now, mark, waiting not yet admitted, server time (ms), the
--   opening is still moving the pre-queue into the line (0|1), tick length (ms), batch, max waiting or 0, max active
--   or 0, paused (0|1), sold out (0|1), users per tick in force (the batch, less while the shop is unhealthy; 0
--   held), the range of seqs a failover fenced by this call may have lost (0, 0: no fence), and the sub-lines the
--   config says the line spans (not ARGV's: nothing was done)
local waiting, heartbeat, seq, mark, tick, stats, waits, admissions, config, prequeue, draw, active, health,
  events, ended, budget, pace, fence = unpack(KEYS)
local default_tick_ms, default_batch, catchup_ticks, idle_ttl_ms, outbox_cap, outbox_ttl_ms, seen_tick_ms, seen_mark,
  fence_margin_us, fence_window_ms, shards, share, through, plan_tick_ms = unpack(ARGV)
local emit = outbox(events, stats, outbox_cap, outbox_ttl_ms)
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local config_values = redis.call('HMGET', config, 'batch', 'tick_ms', 'max_active', 'opens_at_ms', 'max_waiting',
  'paused', 'sold_out', 'slo_p95_ms', 'slo_error_rate', 'safety_net', 'shards')
local spans = tonumber(config_values[11] or '1')
if spans ~= tonumber(shards) then
  -- The pump took the line for another count of sub-lines: it ticks again with this one.
  return {0, 0, 0, 0, now, 0, 0, 0, 0, 0, 0, 0, '0', 0, 0, spans}
end
local planned = tonumber(share) >= 0
local tick_ms = tonumber(config_values[2] or default_tick_ms)
local batch = tonumber(config_values[1] or default_batch)
local held = config_values[6] == '1' or config_values[7] == '1'
local per_tick = batch
if config_values[8] or config_values[9] then
  per_tick = math.min(batch, tonumber(redis.call('HGET', health, 'allowed') or batch))
end
local tick_number = planned and math.floor(tonumber(plan_tick_ms) / tick_ms) or math.floor(now / tick_ms)
-- Kept as a time, not a tick number, so a change of tick length never replays or skips a tick.
local last = tonumber(redis.call('GET', tick))
local mark_text = redis.call('GET', mark) or '0'
-- The failover fence (docs/failover.md#the-fences). A node holding an older tick or a lower mark than the calling
-- pump saw applied has lost writes: a promoted replica that lagged. Tick and mark go back to what the pump saw (no
-- tick applied twice, no admission undone), the seq above the clock by the margin (no seq handed out twice), and
-- the seqs that may have been lost are recorded: from the node's last tick or mark (what came before reached it)
-- to the raised seq. A node with no tick at all lost everything (or never had this target): nothing bounds what it
-- lost, so it opens no window for restoring admitted places (status.lua).
local fenced_from, fenced_to = 0, 0
if tonumber(seen_tick_ms) > (last or 0) or tonumber(seen_mark) > tonumber(mark_text) then
  local last_before = last
  fenced_from = math.max((last or 0) * 1000, tonumber(mark_text))
  fenced_to = math.max(tonumber(redis.call('GET', seq) or '0'),
    tonumber(time[1]) * 1000000 + tonumber(time[2]) + tonumber(fence_margin_us))
  redis.call('SET', seq, string.format('%d', fenced_to), 'PX', idle_ttl_ms)
  if tonumber(seen_tick_ms) > (last or 0) then
    last = tonumber(seen_tick_ms)
    redis.call('SET', tick, seen_tick_ms, 'PX', idle_ttl_ms)
  end
  if tonumber(seen_mark) > tonumber(mark_text) then
    mark_text = seen_mark
    redis.call('SET', mark, mark_text, 'PX', idle_ttl_ms)
  end
  redis.call('HSET', fence, 'lost_from', string.format('%d', fenced_from), 'lost_to', string.format('%d', fenced_to),
    'until_ms', last_before and now + tonumber(fence_window_ms) or now, 'mark', mark_text)
  redis.call('PEXPIRE', fence, idle_ttl_ms)
  redis.call('HINCRBY', stats, 'fences', 1)
end
-- The reply: what this call did, then the target's configuration in force and the fence, if any.
local function answer(applied_tick, admitted, waiting_now, needs_draw)
  return {applied_tick, admitted, tonumber(mark_text), waiting_now, now, needs_draw, tick_ms, batch,
    tonumber(config_values[5] or '0'), tonumber(config_values[3] or '0'), config_values[6] == '1' and 1 or 0,
    config_values[7] == '1' and 1 or 0, held and '0' or tostring(per_tick), fenced_from, fenced_to, spans}
end
local collecting = redis.call('ZCOUNT', waiting, '-inf', mark_text)
local waiting_count = redis.call('ZCARD', waiting) - collecting
if last and tick_number * tick_ms <= last then
  return answer(0, 0, waiting_count, 0)
end

-- Sliding TTL: a queue the pump still visits stays alive (its configuration is the operator's to keep).
local function keep_alive()
  for _, key in ipairs({waiting, heartbeat, seq, mark, stats, waits, admissions, prequeue, draw, active, ended, pace,
      fence}) do
    redis.call('PEXPIRE', key, idle_ttl_ms)
  end
end

-- The opening (docs/guarantees.md#the-opening-draw). The pre-queue took its drawn places as it entered, so opening
-- makes it the line (a RENAME, when nobody waits in line yet; else the smaller of the two moves into the larger, at
-- most OPENING_MOVE users a tick, admitting nobody until it is done) and reveals the seed. Then this tick admits.
local OPENING_MOVE = 5000
local opens_at = tonumber(config_values[4])
if opens_at and now >= opens_at then
  local drawn_for, draw_state, drawn_with = unpack(redis.call('HMGET', draw, 'opens_at_ms', 'state', 'commitment'))
  if drawn_for ~= config_values[4] or draw_state ~= 'done' then
    local in_line, pre_queued = redis.call('ZCARD', waiting), redis.call('ZCARD', prequeue)
    local seed, commitment = unpack(redis.call('HMGET', config, 'draw_seed', 'draw_commitment'))
    -- The record is this opening's if its pre-queue was drawn with this seed, or a tick began opening it already;
    -- else it is an earlier opening's.
    if drawn_for ~= config_values[4] and not (commitment and drawn_with == commitment) then
      redis.call('DEL', draw)
    end
    redis.call('HSET', draw, 'opens_at_ms', config_values[4])
    redis.call('HSETNX', draw, 'placed', pre_queued)
    if in_line == 0 and pre_queued > 0 then
      redis.call('RENAME', prequeue, waiting)
    elseif pre_queued > 0 then
      -- ZRANGE's member, score pairs as ZADD's score, member pairs, and the members, in chunks: Lua's stack bounds
      -- how many arguments one call may take.
      local function chunks(moving)
        local found = {}
        for i = 1, #moving, 2000 do
          local scored, users = {}, {}
          for n = i, math.min(i + 1999, #moving), 2 do
            scored[#scored + 1] = moving[n + 1]
            scored[#scored + 1] = moving[n]
            users[#users + 1] = moving[n]
          end
          found[#found + 1] = {scored, users}
        end
        return found
      end
      local left
      if in_line < pre_queued then
        for _, chunk in ipairs(chunks(redis.call('ZRANGE', waiting, 0, OPENING_MOVE - 1, 'WITHSCORES'))) do
          redis.call('ZADD', prequeue, unpack(chunk[1]))
          redis.call('ZREM', waiting, unpack(chunk[2]))
        end
        left = redis.call('ZCARD', waiting)
        if left == 0 then
          redis.call('RENAME', prequeue, waiting)
        end
      else
        for _, chunk in ipairs(chunks(redis.call('ZRANGE', prequeue, 0, OPENING_MOVE - 1, 'WITHSCORES'))) do
          redis.call('ZADD', waiting, unpack(chunk[1]))
          redis.call('ZREM', prequeue, unpack(chunk[2]))
        end
        left = redis.call('ZCARD', prequeue)
      end
      if left > 0 then
        redis.call('SET', tick, tick_number * tick_ms, 'PX', idle_ttl_ms)
        keep_alive()
        return answer(tick_number, 0, waiting_count, 1)
      end
    end
    redis.call('HSET', draw, 'state', 'done', 'drawn_at_ms', now)
    redis.call('PEXPIRE', draw, idle_ttl_ms)
    local placed = redis.call('HGET', draw, 'placed')
    if seed then
      -- The seed is revealed once it can no longer help anyone: the line is open. The next opening commits anew.
      redis.call('HSET', draw, 'seed', seed, 'commitment', commitment)
      redis.call('HDEL', config, 'draw_seed', 'draw_commitment')
      emit('TargetOpened', 'seed', seed, 'placed', placed, 'opens_at_ms', config_values[4], 'commitment', commitment)
    else
      emit('TargetOpened', 'placed', placed, 'opens_at_ms', config_values[4])
    end
    collecting = redis.call('ZCOUNT', waiting, '-inf', mark_text)
    waiting_count = redis.call('ZCARD', waiting) - collecting
    -- This tick admits one tick's batch: the line starts at the configured rate, not catching up on the wait.
    last = tick_number * tick_ms - tick_ms
  end
end

-- Ticks missed (a lapsed lock, a late pump) are made up for, up to the cap.
local covered = 1
if last then
  covered = math.max(1, math.min(math.floor((tick_number * tick_ms - last) / tick_ms), tonumber(catchup_ticks)))
end
-- Every user waiting since the last tick could have left: the time the departures' rate is measured over.
if waiting_count > 0 then
  redis.call('HINCRBY', stats, 'waiting_user_ms', waiting_count * (last and tick_number * tick_ms - last or tick_ms))
end
-- What these ticks may admit. Below the batch, users per tick may be fractional: the fraction carries over to the
-- next tick. A planned tick admits its share: the pump counted the rate, the hold and maxActive over all sub-lines.
local admitted, net, passed
if planned then
  admitted = math.min(tonumber(share), redis.call('ZCOUNT', waiting, '(' .. mark_text, through))
  passed = 0
else
  local allowance = per_tick * covered
  if per_tick < batch then
    allowance = allowance + tonumber(redis.call('HGET', pace, 'carry') or '0')
  end
  -- What the safety net admitted since the last applied tick came out of these ticks' budget.
  net = tick_budget(budget, idle_ttl_ms)
  passed = net.spent(tick_number * tick_ms, covered)
  allowance = math.max(0, allowance - passed)
  admitted = math.min(math.floor(allowance), waiting_count)
  if held then
    admitted = 0
  elseif per_tick < batch then
    redis.call('HSET', pace, 'carry', admitted < waiting_count and tostring(allowance - admitted) or '0')
  end
  -- maxActive: admitted users not done with their turn (still collecting, or holding a live unused token)
  -- take up room.
  local max_active = tonumber(config_values[3])
  if max_active then
    redis.call('ZREMRANGEBYSCORE', active, '-inf', now)
    local active_count = collecting + redis.call('ZCARD', active)
    admitted = math.max(0, math.min(admitted, max_active - active_count))
  end
end
-- Places a fence's restore admitted that the old primary had not (status.lua) were admitted past the batch: they
-- take these slots, so the rate holds over the failover. The mark meanwhile passes lost seqs whose holders have not
-- polled yet, and each of them is one more such place.
local overdraft = math.min(admitted, tonumber(redis.call('HGET', fence, 'overdraft') or '0'))
if overdraft > 0 then
  admitted = admitted - overdraft
  redis.call('HINCRBY', fence, 'overdraft', -overdraft)
end
if admitted > 0 then
  -- Ranks follow seq, and users who left or were evicted hold no rank: the mark moves to the
  -- admitted-th user still waiting, never past the last one.
  local newly = redis.call('ZRANGE', waiting, collecting, collecting + admitted - 1, 'WITHSCORES')
  mark_text = newly[#newly]
  for i = 1, #newly, 2 do
    emit('UserAdmitted', 'user', newly[i], 'seq', newly[i + 1], 'queued', '1')
  end
  redis.call('SET', mark, mark_text, 'PX', idle_ttl_ms)
  redis.call('HINCRBY', stats, 'admitted', admitted)
  -- The records of entries the mark passed restore nothing any more, but while a fence's window lasts, those among
  -- the seqs it found lost.
  local floor = tonumber(mark_text)
  local lost_from, until_ms = unpack(redis.call('HMGET', fence, 'lost_from', 'until_ms'))
  if lost_from and now < tonumber(until_ms) then
    floor = math.min(floor, tonumber(lost_from))
  end
  redis.call('ZREMRANGEBYSCORE', ended, '-inf', string.format('%d', floor))
end
redis.call('SET', tick, tick_number * tick_ms, 'PX', idle_ttl_ms)
if config_values[10] == '1' then
  net.settle(tick_number * tick_ms, admitted, per_tick, batch)
elseif passed > 0 then
  -- The net was switched off: this tick took what it had admitted, nothing is left to count.
  redis.call('DEL', budget)
end

-- The measured rate counts only ticks that left users waiting: a tick short of users measures demand,
-- not how fast the line moves. Running sums in `pace` keep this O(1) per tick.
-- Slots restores took count as admissions: the line moved that fast.
if waiting_count - admitted > 0 and not held then
  redis.call('LPUSH', admissions, tick_number * tick_ms .. ':' .. (admitted + overdraft) .. ':' .. covered)
  redis.call('HINCRBY', pace, 'rate_admitted', admitted + overdraft)
  redis.call('HINCRBY', pace, 'rate_ticks', covered)
end
local oldest = tick_number * tick_ms - 60000
while true do
  local entry = redis.call('LINDEX', admissions, -1)
  if not entry then break end
  local at, count, ticks = string.match(entry, '^(%d+):(%d+):(%d+)$')
  if tonumber(at) > oldest then break end
  redis.call('RPOP', admissions)
  redis.call('HINCRBY', pace, 'rate_admitted', -tonumber(count))
  redis.call('HINCRBY', pace, 'rate_ticks', -tonumber(ticks))
end
local ticks = tonumber(redis.call('HGET', pace, 'rate_ticks') or '0')
if ticks > 0 then
  local per_second = tonumber(redis.call('HGET', pace, 'rate_admitted')) * 1000 / (ticks * tick_ms)
  redis.call('HSET', pace, 'rate', string.format('%.3f', per_second))
else
  redis.call('HDEL', pace, 'rate')
end

keep_alive()
return answer(tick_number, admitted, waiting_count - admitted, 0)
