-- enter.lua: put a user in line, idempotently, or hand back what they already hold.
-- Before the target opens (config opens_at_ms), newcomers wait in the pre-queue, each at the place the opening draw
-- gives them (a seq drawn from the committed seed); once the pump opened the line, newcomers queue behind it.
-- With the safety net on (config safety_net), a newcomer nobody waits ahead of is admitted at once while the
-- tick's budget lasts (lua/budget.lua): one round trip, no poll.
-- KEYS[1] waiting     zset: user id -> seq (users in line, admitted ones until they collect their token)
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms); a pre-queued user's is the opening
-- KEYS[3] seq         the last sequence number handed out (the pre-queue's block of seqs lies below it)
-- KEYS[4] mark        admitted mark: a user whose seq <= mark is admitted (a new line's starts below its first seq)
-- KEYS[5] token       this user's issued entry token, '<entry number> <grant: expiry.id>' (expires with it)
-- KEYS[6] registered  present while the pump knows this target
-- KEYS[7] stats       hash of counters: `not_invited` counts enters an invite-only target refused,
--                     `passed_through` newcomers the safety net admitted; eta_left, evicted, waiting_user_ms
--                     (departures and the time they are a rate of)
-- KEYS[8] config      hash: the target's own batch, tick_ms, max_waiting, opens_at_ms, closes_at_ms, known_since_ms,
--                     sold_out, paused, flag_version (the switch's mark, flags.py), invite_only, safety_net,
--                     max_active, draw_seed (the opening's committed seed), draw_block (the pre-queue's block of
--                     seqs a sharded line's configuration fixed for every sub-line), shards (the line's sub-lines)
-- KEYS[9] prequeue    zset: user id -> drawn seq, before opening
-- KEYS[10] draw       hash: `first` and `last`, the block of seqs the pre-queue's places are drawn in, fixed by its
--                     first entry for the seed whose `commitment` it records; opens_at_ms and `state` ('done') of
--                     the opening that made the pre-queue the line
-- KEYS[11] active     zset: user id -> expiry (ms) of their issued, unconsumed entry token
-- KEYS[12] budget     hash: the admissions counted against the current tick (budget.lua), for the safety net
-- KEYS[13] events     the target's outbox stream (outbox.lua): UserAdmitted for a user the safety net admits
-- KEYS[14] pace       hash: `rate`, admissions per second measured by the pump (absent: none yet)
-- KEYS[15] passed     zset: user id -> server time (ms) of the safety net's last pass for them
-- ARGV[1] user_id                  user id
-- ARGV[2] now_ms                   now (ms)
-- ARGV[3] default_max_waiting      default max waiting
-- ARGV[4] idle_ttl_ms              idle TTL (ms)
-- ARGV[5] entry_key                the key this user's token ids at this target are drawn with (tokens.py): an
--                                  entry token's grant is drawn from it and the entry's seq only if this call admits
-- ARGV[6] grant_expires_s          the grant's expiry (epoch s)
-- ARGV[7] grant_ttl_ms             its TTL (ms)
-- ARGV[8] grant_expires_ms         its expiry (epoch ms)
-- ARGV[9] registration_refresh_ms  how long a registration is trusted before the next enter registers the target
--                                  again (ms)
-- ARGV[10] default_batch           default batch
-- ARGV[11] default_tick_ms         default tick length (ms)
-- ARGV[12] open_on_first_use       '1': a first enter opens a target no operator configured
--                                  (VQ_TARGETS_OPEN_ON_FIRST_USE), else '0'
-- ARGV[13] invited                 '1': the caller's verified invites name this target, else '0'
-- ARGV[14] outbox_cap              outbox cap (events)
-- ARGV[15] outbox_ttl_ms           outbox TTL (ms)
-- ARGV[16] flag_version            the flag version the caller decided by ('*': whatever the target carries)
-- ARGV[17] queued                  its decision (1 queue, 0 not)
-- ARGV[18] pass_window_ms          the safety net lets a user pass at most once in this long (ms)
-- ARGV[19] shards                  the line's sub-lines as the caller believes (docs/sharding.md): it routed the
--                                  user by it, so another count than this sub-line's config holds refuses the call
-- Returns one of:
--   {'ADMITTED', held, issued_now}  held: 'entry number grant'; issued now (0|1)
--   {'PASSED', held, register}  the safety net admitted the newcomer at once; target needs registering (0|1)
--   {'WAITING', seq, ahead, rate, paused, created, register, left, evicted, waiting_user_ms}  seq, users ahead,
--     admissions per second, paused (0|1), created (0|1), target needs registering (0|1), and the counters the
--     ETA's range comes from (chalicelib/eta.py)
--   {'PRE_QUEUE', arrival, opens_at_ms, created, register}  drawn seq, opens at (ms), created (0|1), target needs
--     registering (0|1)
--   {'FULL'}
--   {'CLOSED'}
--   {'NOT_INVITED'} (the target is invite-only and the caller is not invited: only the count is written)
--   {'SOLD_OUT'} (the user's place, if any, is released)
--   {'UNKNOWN_TARGET'} (nothing was written)
--   {'OFF'} (the queue is off for this user)
--   {'FLAG', target_version}  the target's flag version (nothing was written)
--   {'SHARDS', shards}  the sub-line's count of sub-lines, not the caller's: it must route again (nothing was written)
local waiting, heartbeat, seq, mark, token, registered, stats, config, prequeue, draw, active, budget,
  events, pace, passed = unpack(KEYS)
local user_id, now_ms, default_max_waiting, idle_ttl_ms, entry_key, grant_expires_s, grant_ttl_ms, grant_expires_ms,
  registration_refresh_ms, default_batch, default_tick_ms, open_on_first_use, invited, outbox_cap, outbox_ttl_ms,
  flag_version, queued, pass_window_ms, shards = unpack(ARGV)
local now = tonumber(now_ms)
local config_values = redis.call('HMGET', config, 'batch', 'tick_ms', 'max_waiting', 'opens_at_ms', 'closes_at_ms',
  'known_since_ms', 'sold_out', 'paused', 'flag_version', 'invite_only', 'safety_net', 'shards')
-- Routed by another count of sub-lines than the line has (a resize since the caller learnt it): the user may belong
-- to another sub-line, so nothing is written here, not even a place.
if (config_values[12] or '1') ~= shards then
  return {'SHARDS', config_values[12] or '1'}
end
-- The queue's switch (flags.py): a target marked with another flag version than the caller decided by sends
-- the caller to look again before anything changes; else the caller's decision stands.
if config_values[9] and flag_version ~= '*' and config_values[9] ~= flag_version then
  return {'FLAG', config_values[9]}
end
-- An unknown target is refused even with the queue off: a direct entry token for it would buy nothing.
if not config_values[6] and open_on_first_use ~= '1' then
  return {'UNKNOWN_TARGET'}
end
-- Invite-only holds even with the queue off for the caller: a direct entry token would let them in.
if config_values[10] == '1' and invited ~= '1' then
  redis.call('HINCRBY', stats, 'not_invited', 1)
  redis.call('PEXPIRE', stats, idle_ttl_ms, 'NX')
  return {'NOT_INVITED'}
end
if queued == '0' then
  return {'OFF'}
end
if not config_values[6] then
  redis.call('HSET', config, 'known_since_ms', now)
end
local held = redis.call('GET', token)
if held then
  return {'ADMITTED', held, 0}
end
-- Sold out: tokens already issued stay valid (above), nobody else gets or keeps a place.
if config_values[7] == '1' then
  if math.max(redis.call('ZREM', waiting, user_id), redis.call('ZREM', prequeue, user_id)) == 1 then
    redis.call('HINCRBY', stats, 'sold_out_released', 1)
  end
  redis.call('ZREM', heartbeat, user_id)
  return {'SOLD_OUT'}
end

-- Numbers go back to Redis as the text they came in (ARGV, replies): a Lua number turned into text costs a printf,
-- and a seq has more digits than Lua's 14 (it would come out as 1.79...e+15).
local mark_text = redis.call('GET', mark) or '0'
local mark_number = tonumber(mark_text)
local seq_text = redis.call('ZSCORE', waiting, user_id)
local seq_number = tonumber(seq_text)
if seq_number and seq_number <= mark_number then
  -- The token id is drawn from the entry (tokens.py's token_id_of), so every admission of it carries the same one.
  held = seq_text .. ' ' .. grant_expires_s .. '.' .. string.sub(redis.sha1hex(entry_key .. '|' .. seq_text), 1, 22)
  redis.call('SET', token, held, 'PX', grant_ttl_ms)
  redis.call('ZREM', waiting, user_id)
  redis.call('ZREM', heartbeat, user_id)
  redis.call('ZADD', active, grant_expires_ms, user_id)
  redis.call('PEXPIRE', active, idle_ttl_ms, 'NX')
  return {'ADMITTED', held, 1}
end

-- The next seq (docs/failover.md#the-fences): above the last one handed out and never below the server clock in
-- microseconds, so a promoted replica that lacks the newest entries hands out seqs above theirs without waiting for
-- anyone to notice the failover. The clock is almost always ahead: one SET ... GET. Returns it as text, and the
-- server time (ms).
local function next_seq()
  local time = redis.call('TIME')
  local number = tonumber(time[1]) * 1000000 + tonumber(time[2])
  local text = string.format('%d', number)
  local before = redis.call('SET', seq, text, 'KEEPTTL', 'GET')
  if before and tonumber(before) >= number then
    text = string.format('%d', tonumber(before) + 1)
    redis.call('SET', seq, text, 'KEEPTTL')
  elseif not before then
    -- A new line: its mark starts just below its first seq, so no ticket of an earlier line restores a place in it.
    mark_text = string.format('%d', number - 1)
    redis.call('SET', mark, mark_text, 'PX', idle_ttl_ms)
  end
  return text, tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- The opening draw's order (chalicelib/opening.py's drawn_seq is the same function): HMAC-SHA1 keyed with the seed's
-- text (64 hex digits, the HMAC's block) of the user id, its first 52 bits as a fraction of the pre-queue's block of
-- seqs. SHA-1 because it is the hash Redis' Lua has. The HMAC's padded keys are made once, with the block, and kept
-- beside it (text: hex digits XOR the pads stay below 0x80): each entry then costs two SHA-1s.
local MIN_BLOCK_US = 1000000 -- a block spans at least a second of seqs (the failover fence's margin)
local function bytes_of(hex)
  return (string.gsub(hex, '..', function(pair) return string.char(tonumber(pair, 16)) end))
end
local function padded_keys(seed)
  local inner, outer = {}, {}
  for i = 1, 64 do
    inner[i] = string.char(bit.bxor(string.byte(seed, i), 0x36))
    outer[i] = string.char(bit.bxor(string.byte(seed, i), 0x5c))
  end
  return table.concat(inner), table.concat(outer)
end
local function drawn_seq(inner, outer, user, first, last)
  local digest = redis.sha1hex(outer .. bytes_of(redis.sha1hex(inner .. user)))
  return first + math.floor(tonumber(string.sub(digest, 1, 13), 16) / 4503599627370496 * (last - first + 1))
end

local arrival = tonumber(redis.call('ZSCORE', prequeue, user_id))
local created = 0
local ahead
local passes -- the safety net admits the newcomer now
if not seq_number and not arrival then
  local closes_at = tonumber(config_values[5])
  if closes_at and now >= closes_at then
    return {'CLOSED'}
  end
  -- Only users not yet admitted take up capacity; a newcomer has every one of those in line ahead.
  ahead = redis.call('ZCOUNT', waiting, '(' .. mark_text, '+inf')
  local pre_queued = redis.call('ZCARD', prequeue)
  if ahead + pre_queued >= tonumber(config_values[3] or default_max_waiting) then
    return {'FULL'}
  end
  local opens_at = tonumber(config_values[4])
  local drawn_for, draw_state, first, last, drawn_with, inner, outer
  if opens_at then
    drawn_for, draw_state, first, last, drawn_with, inner, outer = unpack(redis.call('HMGET', draw, 'opens_at_ms',
      'state', 'first', 'last', 'commitment', 'inner_key', 'outer_key'))
  end
  if opens_at and now < opens_at and not (drawn_for == config_values[4] and draw_state == 'done') then
    -- The pre-queue: the newcomer's place is drawn now (docs/guarantees.md#the-opening-draw), from the seed committed
    -- with the opening, inside a block of seqs that the first entry fixes above every seq handed out before and the
    -- counter then jumps over, so everyone who enters after the opening stands behind the whole pre-queue.
    local commitment, block = unpack(redis.call('HMGET', config, 'draw_commitment', 'draw_block'))
    if not commitment then
      -- An opening configured before seeds were committed: its pre-queue keeps arrival order.
      arrival = tonumber((next_seq()))
    else
      -- The block belongs to the seed (which moving the opening keeps), recorded by its commitment; a sharded line's
      -- is the one its configuration gives (a resize gives a new one).
      if drawn_with ~= commitment or block and block ~= first .. ' ' .. last then
        first = (next_seq())
        last = string.format('%d', math.max(opens_at * 1000 - 1, tonumber(first) + MIN_BLOCK_US - 1))
        if block then
          -- A sharded line's block, one for every sub-line so that their drawn places compare (lua/configure.lua);
          -- next_seq above has made a new line's keys, and the counter still jumps past the block.
          first, last = string.match(block, '^(%d+) (%d+)$')
        end
        inner, outer = padded_keys(redis.call('HGET', config, 'draw_seed'))
        redis.call('SET', seq, last, 'KEEPTTL')
        redis.call('DEL', draw)
        redis.call('HSET', draw, 'commitment', commitment, 'first', first, 'last', last, 'inner_key', inner,
          'outer_key', outer)
        redis.call('PEXPIRE', draw, idle_ttl_ms)
      end
      arrival = drawn_seq(inner, outer, user_id, tonumber(first), tonumber(last))
    end
    redis.call('ZADD', prequeue, string.format('%d', arrival), user_id)
    -- Their heartbeat starts at the opening: they have no place to poll before it.
    redis.call('ZADD', heartbeat, config_values[4], user_id)
    if pre_queued == 0 then
      -- A new pre-queue expires, as a new line does below.
      redis.call('PEXPIRE', prequeue, idle_ttl_ms, 'NX')
      redis.call('PEXPIRE', heartbeat, idle_ttl_ms, 'NX')
    end
  else
    local server_ms
    seq_text, server_ms = next_seq()
    local number = tonumber(seq_text)
    -- The safety net: with nobody waiting ahead, not paused and the opening's draw (if any) done, the newcomer is
    -- admitted now if they did not pass within the window, maxActive has room and the tick's budget, which the pump
    -- shares, lasts. One pass per user in the window: an account that leaves (or buys) and enters again queues, so
    -- it cannot take the tick's budget from everyone else.
    local since = server_ms - tonumber(pass_window_ms)
    if config_values[11] == '1' and ahead == 0 and config_values[8] ~= '1' and pre_queued == 0 then
      local max_active = tonumber(redis.call('HGET', config, 'max_active'))
      if max_active then
        redis.call('ZREMRANGEBYSCORE', active, '-inf', server_ms)
      end
      passes = tonumber(redis.call('ZSCORE', passed, user_id) or since) <= since
        and (not opens_at or drawn_for == config_values[4] and draw_state == 'done')
        and (not max_active
          or redis.call('ZCOUNT', waiting, '-inf', mark_text) + redis.call('ZCARD', active) < max_active)
        and tick_budget(budget, idle_ttl_ms).take(server_ms, tonumber(config_values[2] or default_tick_ms),
          tonumber(config_values[1] or default_batch))
    end
    if passes then
      -- An entry number like any newcomer's, and the mark past it: seq <= mark still means admitted.
      held = seq_text .. ' ' .. grant_expires_s .. '.' .. string.sub(redis.sha1hex(entry_key .. '|' .. seq_text), 1, 22)
      redis.call('SET', token, held, 'PX', grant_ttl_ms)
      redis.call('SET', mark, seq_text, 'PX', idle_ttl_ms)
      redis.call('ZADD', active, grant_expires_ms, user_id)
      redis.call('PEXPIRE', active, idle_ttl_ms, 'NX')
      redis.call('HINCRBY', stats, 'passed_through', 1)
      redis.call('PEXPIRE', stats, idle_ttl_ms, 'NX')
      redis.call('ZREMRANGEBYSCORE', passed, '-inf', since)
      redis.call('ZADD', passed, server_ms, user_id)
      redis.call('PEXPIRE', passed, pass_window_ms)
      outbox(events, stats, outbox_cap, outbox_ttl_ms)('UserAdmitted', 'user', user_id, 'seq', seq_text, 'queued', '0')
    else
      seq_number = number
      redis.call('ZADD', waiting, seq_text, user_id)
    end
  end
  created = 1
end
if seq_number then
  redis.call('ZADD', heartbeat, now_ms, user_id)
  -- The first newcomer of an emptied line writes its keys anew: they expire at once, not at the pump's next tick.
  if created == 1 and ahead == 0 then
    redis.call('PEXPIRE', waiting, idle_ttl_ms, 'NX')
    redis.call('PEXPIRE', heartbeat, idle_ttl_ms, 'NX')
  end
end

-- Not sliding: should the registration itself be lost, an enter within registration_refresh_ms registers again.
local register = 0
if redis.call('SET', registered, '1', 'NX', 'PX', registration_refresh_ms) then
  register = 1
  -- Sliding TTL, refreshed by the pump every tick and here at each registration (so at least once a
  -- minute while people arrive, and on the very first entry): a queue nobody enters and no pump visits
  -- cleans itself up. Not on every entry: five PEXPIREs would be a third of a newcomer's cost.
  for _, key in ipairs({waiting, heartbeat, seq, mark, prequeue}) do
    redis.call('PEXPIRE', key, idle_ttl_ms)
  end
end
if passes then
  return {'PASSED', held, register}
end
if not seq_number then
  return {'PRE_QUEUE', arrival, config_values[4], created, register}
end
ahead = ahead or redis.call('ZCOUNT', waiting, '(' .. mark_text, '(' .. seq_text)
-- A sub-line's rate is its share of the line's (chalicelib/answers.py scales what it answers to the whole line).
local rate = redis.call('HGET', pace, 'rate') or tostring(tonumber(config_values[1] or default_batch) * 1000
  / tonumber(config_values[2] or default_tick_ms) / (shards == '1' and 1 or tonumber(shards)))
-- The answer is flat: on the server, each list in a reply costs about as much as five fields of it.
local left, evicted, waiting_user_ms = unpack(redis.call('HMGET', stats, 'eta_left', 'evicted',
  'waiting_user_ms'))
return {'WAITING', seq_number, ahead, rate, config_values[8] == '1' and 1 or 0, created, register, left, evicted,
  waiting_user_ms}
