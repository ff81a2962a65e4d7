-- status.lua: a waiting user's poll (also their heartbeat); admits them once the mark has passed their seq.
-- Admitting takes the grant and what the wait is recorded with: a caller passes them (KEYS[12..], ARGV[8..]) only
-- when the poll may admit (chalicelib/queue.py), so that the common poll, a user still waiting, carries none of it.
-- Without them, a poll that would admit answers DUE before admitting, and the caller asks again with them.
-- KEYS[1] waiting     zset: user id -> seq (no user in it holds a token: admission moves them out)
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms); a pre-queued user's is the opening
-- KEYS[3] mark        admitted mark: a user whose seq <= mark is admitted
-- KEYS[4] token       this user's issued entry token, '<entry number> <grant: expiry.id>' (expires with it)
-- KEYS[5] stats       hash of counters: wait_count, wait_ms, restored; eta_left, evicted, waiting_user_ms (departures
--                     and the time they are a rate of); the ETA's accuracy: eta_samples, eta_inside, and
--                     `eta_error:<bucket>`, a histogram of etaSeconds' absolute error (buckets as the waits')
-- KEYS[6] pace        hash: `rate`, admissions per second measured by the pump (admit.lua)
-- KEYS[7] config      hash: the target's own batch, tick_ms, opens_at_ms, known_since_ms, sold_out, paused, shards
-- KEYS[8] prequeue    zset: user id -> drawn seq, before opening
-- KEYS[9] draw        hash: opens_at_ms and state ('done': the opening made the pre-queue the line)
-- KEYS[10] ended      zset: user id -> seq of their last entry that ended on purpose (left, evicted)
-- KEYS[11] fence      hash: the last failover fenced (admit.lua): `lost_from`, `lost_to`, the seqs it may have lost,
--                     and `until_ms`, until when an entry among them the mark passed is restored admitted; `mark`,
--                     the mark it raised the node to, and `overdraft`, the places restored admitted above it, which
--                     the pump's next ticks leave out
-- KEYS[12] waits      hash: wait-time histogram bucket -> users admitted with such a wait (admitting only)
-- KEYS[13] active     zset: user id -> expiry (ms) of their issued, unconsumed entry token (admitting only)
-- ARGV[1] user_id           user id
-- ARGV[2] now_ms            now (ms)
-- ARGV[3] default_batch     default batch
-- ARGV[4] default_tick_ms   default tick length (ms)
-- ARGV[5] ticket_entry      the entry number on the caller's ticket
-- ARGV[6] flag_version      the flag version the caller decided by ('*': whatever the target carries)
-- ARGV[7] queued            its decision (1 queue, 0 not)
-- ARGV[8] shards            the line's sub-lines as the caller believes, which it routed the user by
-- ARGV[9] grant             a fresh entry token's grant, stored (after the entry's number) if this call admits the
--                           user (admitting only, as the rest)
-- ARGV[10] grant_ttl_ms     its TTL (ms)
-- ARGV[11] grant_expires_ms its expiry (epoch ms)
-- ARGV[12] wait_ms          the user's wait so far (ms)
-- ARGV[13] wait_bucket      its histogram bucket
-- ARGV[14] told_inside      whether the wait so far lies in the range the ticket's entry was first told (1|0; '':
--                           it was told none)
-- ARGV[15] told_error_bucket the histogram bucket of |wait - the etaSeconds it was first told|
-- ARGV[16] idle_ttl_ms      idle TTL (ms)
-- Returns one of:
--   {'ADMITTED', held, issued_now}  held: 'entry number grant'; issued now (0|1)
--   {'DUE'} (the mark has passed the user's seq, and the call brought no grant: ask again with one)
--   {'WAITING', seq, ahead, rate, paused, mark, batch, tick_ms, drawn, left, evicted, waiting_user_ms}  seq, users
--     ahead, admissions per second, paused (0|1), and what a container needs to reckon the line while Redis cannot
--     be asked (chalicelib/reckoning.py): the admitted mark, the batch and tick length in force, and 0, or -1
--     while an opening is pending (the pre-queue is not yet in line: the line's numbers are not settled); and the
--     counters the ETA's range comes from (chalicelib/eta.py)
--   {'PRE_QUEUE', arrival, opens_at_ms}  drawn seq, opens at (ms)
--   {'NOT_IN_QUEUE'} (and the ticket restores nothing)
--   {'OTHER_ENTRY'} (the ticket is of an earlier entry: nothing changes)
--   {'UNKNOWN_TARGET'}
--   {'SOLD_OUT'} (the user's place, if any, is released: counted as `sold_out_released` in stats)
--   {'OFF'} (the queue is off for this user)
--   {'FLAG', target_version}  the target's flag version
--   {'SHARDS', shards}  the sub-line's count of sub-lines, not the caller's: it must route again (nothing changes)
local waiting, heartbeat, mark, token, stats, pace, config, prequeue, draw, ended, fence, waits,
  active = unpack(KEYS)
local user_id, now_ms, default_batch, default_tick_ms, ticket_entry, flag_version, queued, shards, grant,
  grant_ttl_ms, grant_expires_ms, wait_ms, wait_bucket, told_inside, told_error_bucket, idle_ttl_ms = unpack(ARGV)
-- The queue's switch (flags.py): a target marked with another flag version than the caller decided by sends
-- the caller to look again before anything changes; else the caller's decision stands.
-- The target's settings in one read, the switch's mark among them.
local flag, known_since, sold_out, paused, batch, tick_ms, opens_at, line_shards = unpack(redis.call('HMGET', config,
  'flag_version', 'known_since_ms', 'sold_out', 'paused', 'batch', 'tick_ms', 'opens_at_ms', 'shards'))
-- Routed by another count of sub-lines than the line has: the user's place may be on another sub-line, and a
-- ticket must not restore it here.
if (line_shards or '1') ~= shards then
  return {'SHARDS', line_shards or '1'}
end
if flag and flag_version ~= '*' and flag ~= flag_version then
  return {'FLAG', flag}
end
if queued == '0' then
  return {'OFF'}
end
-- A ticket belongs to one entry: the one whose number it carries.
local function other_entry(number)
  return tonumber(ticket_entry) ~= tonumber(number)
end
-- Whether the opening (if any) has made the pre-queue the line (admit.lua).
local function opened()
  local drawn_for, state = unpack(redis.call('HMGET', draw, 'opens_at_ms', 'state'))
  return drawn_for == opens_at and state == 'done'
end

if not known_since then
  return {'UNKNOWN_TARGET'}
end
-- A user in line holds no token (admission takes them out of it): only one who is not is looked up.
local seq_text = redis.call('ZSCORE', waiting, user_id)
if not seq_text then
  local held = redis.call('GET', token)
  if held then
    if other_entry(string.match(held, '^(%d+) ')) then
      return {'OTHER_ENTRY'}
    end
    return {'ADMITTED', held, 0}
  end
end
-- Sold out: tokens already issued stay valid (above); everyone else hears it at this poll and leaves the line.
if sold_out == '1' then
  local released = math.max(redis.call('ZREM', waiting, user_id), redis.call('ZREM', prequeue, user_id))
  redis.call('ZREM', heartbeat, user_id)
  if released == 1 then
    redis.call('HINCRBY', stats, 'sold_out_released', 1)
  end
  return {'SOLD_OUT'}
end

if not seq_text then
  local arrival = redis.call('ZSCORE', prequeue, user_id)
  if arrival and other_entry(arrival) then
    return {'OTHER_ENTRY'}
  elseif arrival then
    -- A pre-queued user's heartbeat is the opening, which may have moved since they entered.
    if opens_at then
      redis.call('ZADD', heartbeat, opens_at, user_id)
    end
    return {'PRE_QUEUE', arrival, opens_at}
  end
  -- The ticket restores a place the store lost (a failover promoted a replica that lacked it: docs/failover.md),
  -- if the store cannot have forgotten it otherwise: not one its user left or was evicted from, nor one the mark
  -- passed (admitted, or of an earlier line: a new line's mark starts below its first seq) unless it is among the
  -- seqs the last failover may have lost, and that recently.
  local line_mark = redis.call('GET', mark)
  local ticket = tonumber(ticket_entry)
  if not line_mark or ticket <= tonumber(redis.call('ZSCORE', ended, user_id) or '0') then
    return {'NOT_IN_QUEUE'}
  end
  if ticket <= tonumber(line_mark) then
    local lost_from, lost_to, until_ms, fenced_mark = unpack(redis.call('HMGET', fence, 'lost_from', 'lost_to',
      'until_ms', 'mark'))
    if not (lost_from and ticket > tonumber(lost_from) and ticket <= tonumber(lost_to)
        and tonumber(now_ms) < tonumber(until_ms)) then
      return {'NOT_IN_QUEUE'}
    end
    -- Admitted again once only: the record keeps a second poll of this ticket from a second turn.
    redis.call('ZADD', ended, ticket_entry, user_id)
    -- Above the mark the old primary had reached, the mark passed it here without its place, so no tick counted it:
    -- it takes one of the pump's next slots (admit.lua).
    if ticket > tonumber(fenced_mark or '0') then
      redis.call('HINCRBY', fence, 'overdraft', 1)
    end
  end
  redis.call('HINCRBY', stats, 'restored', 1)
  -- What a restore writes lives as long as the line's mark (the pump slides both): a node that lacked these keys
  -- would otherwise hold them with no expiry until the pump's next tick, and for good without one.
  local line_ttl = redis.call('PTTL', mark)
  local function expire_with_line(...)
    for _, key in ipairs(line_ttl > 0 and {...} or {}) do
      redis.call('PEXPIRE', key, line_ttl, 'NX')
    end
  end
  if opens_at and tonumber(now_ms) < tonumber(opens_at) and not opened() then
    redis.call('ZADD', prequeue, ticket_entry, user_id)
    redis.call('ZADD', heartbeat, opens_at, user_id)
    expire_with_line(stats, ended, prequeue, heartbeat)
    return {'PRE_QUEUE', ticket_entry, opens_at}
  end
  redis.call('ZADD', waiting, ticket_entry, user_id)
  redis.call('ZADD', heartbeat, now_ms, user_id)
  expire_with_line(stats, ended, waiting, heartbeat)
  seq_text = ticket_entry
end
-- The same text is the same number (Redis and Python spell a seq alike): the common poll compares no numbers.
if seq_text ~= ticket_entry and other_entry(seq_text) then
  return {'OTHER_ENTRY'}
end
local mark_text = redis.call('GET', mark) or '0'
if tonumber(seq_text) <= tonumber(mark_text) then
  if not grant then
    return {'DUE'}
  end
  local held = seq_text .. ' ' .. grant
  redis.call('SET', token, held, 'PX', grant_ttl_ms)
  redis.call('ZREM', waiting, user_id)
  redis.call('ZREM', heartbeat, user_id)
  redis.call('ZADD', active, grant_expires_ms, user_id)
  redis.call('HINCRBY', stats, 'wait_count', 1)
  redis.call('HINCRBY', stats, 'wait_ms', wait_ms)
  redis.call('HINCRBY', waits, wait_bucket, 1)
  if told_inside ~= '' then
    redis.call('HINCRBY', stats, 'eta_samples', 1)
    redis.call('HINCRBY', stats, 'eta_inside', told_inside)
    redis.call('HINCRBY', stats, 'eta_error:' .. told_error_bucket, 1)
  end
  -- Keys an admission may create expire like the rest of the queue (the pump slides them while it visits).
  for _, key in ipairs({stats, waits, active}) do
    redis.call('PEXPIRE', key, idle_ttl_ms, 'NX')
  end
  return {'ADMITTED', held, 1}
end
redis.call('ZADD', heartbeat, now_ms, user_id)
-- Users ahead are those not yet admitted with a smaller seq (admitted ones still collecting do not count).
-- The bounds as Redis spelt them: a Lua number turned back into text costs a printf.
local ahead = redis.call('ZCOUNT', waiting, '(' .. mark_text, '(' .. seq_text)
-- A sub-line's rate is its share of the line's (chalicelib/answers.py scales what it answers to the whole line).
local rate = redis.call('HGET', pace, 'rate')
  or tostring(tonumber(batch or default_batch) * 1000 / tonumber(tick_ms or default_tick_ms)
    / (shards == '1' and 1 or tonumber(shards)))
-- Until the opening has made the pre-queue the line, a place in line does not tell how many stand ahead of it.
local drawn = (opens_at and not opened()) and '-1' or '0'
-- The answer is flat: on the server, each list in a reply costs about as much as five fields of it.
local left, evicted, waiting_user_ms = unpack(redis.call('HMGET', stats, 'eta_left', 'evicted',
  'waiting_user_ms'))
return {'WAITING', tonumber(seq_text), ahead, rate, paused == '1' and 1 or 0, mark_text, batch or default_batch,
  tick_ms or default_tick_ms, drawn, left, evicted, waiting_user_ms}
