-- line.lua: after each tick, the pump's look at the line from the front: it moves the presence window's edge, starts
-- the heartbeat clock of the places that just crossed into the window, and writes the line's public state, the
-- answer of GET .../line (docs/architecture.md#the-presence-window). O(crossings + points) x log N, whatever N.
-- KEYS[1] waiting     zset: user id -> seq (admitted users stay until they collect their token)
-- KEYS[2] heartbeat   zset: user id -> last poll time (ms); a place that crosses into the window counts from then
-- KEYS[3] mark        admitted mark: a user whose seq <= mark is admitted
-- KEYS[4] window      the presence window's edge: the highest seq inside it (never moves back)
-- KEYS[5] line        the line's public state, JSON (the /line answer but its serverTimeMs)
-- KEYS[6] config      hash: the target's own batch, tick_ms, paused, sold_out, opens_at_ms, closes_at_ms, shards
-- KEYS[7] pace        hash: `rate`, admissions per second measured by the pump (admit.lua)
-- KEYS[8] draw        hash: opens_at_ms and state ('done' once the opening made the pre-queue the line)
-- ARGV[1] default_batch      default batch
-- ARGV[2] default_tick_ms    default tick length (ms)
-- ARGV[3] presence_window_s  the presence window (seconds of waiting at the rate)
-- ARGV[4] read_cap_s         the longest a far-back client goes between reads of /line (published)
-- ARGV[5] max_crossings      most places whose heartbeat clock one call starts
-- ARGV[6] points             points of the line's shape (one every 1/points of the waiting)
-- ARGV[7] idle_ttl_ms        idle TTL (ms)
-- ARGV[8] publish            1: write the state to `line`; 0: answer it (a sub-line's, which the pump merges with the
--                            others': docs/sharding.md). A line the config says is sharded never writes its own.
-- Returns {edge, crossed, waiting, state}: the window's edge, places that crossed into it now, users waiting, and
--   the state unless it was written ('')
local waiting, heartbeat, mark, window, line, config, pace, draw = unpack(KEYS)
local default_batch, default_tick_ms, presence_window_s, read_cap_s, max_crossings, points,
  idle_ttl_ms, publish = unpack(ARGV)
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local batch, tick_ms, paused, sold_out, opens_at, closes_at, shards = unpack(redis.call('HMGET', config, 'batch',
  'tick_ms', 'paused', 'sold_out', 'opens_at_ms', 'closes_at_ms', 'shards'))
local rate = tonumber(redis.call('HGET', pace, 'rate')
  or tonumber(batch or default_batch) * 1000 / tonumber(tick_ms or default_tick_ms))
local mark_text = redis.call('GET', mark) or '0'
local collecting = redis.call('ZCOUNT', waiting, '-inf', mark_text)
local waiting_count = redis.call('ZCARD', waiting) - collecting

-- The window holds the first `reach` users waiting; the edge is the seq of the last of them (all of them, in a
-- shorter line). A line that never outgrew the window has no edge: all of it is inside, those who enter before the
-- next tick too, as evict.lua takes a missing edge. Seqs stay text: they have more digits than Lua's numbers print.
local function seq_at(rank)
  return redis.call('ZRANGE', waiting, rank, rank, 'WITHSCORES')[2]
end
local edge = redis.call('GET', window)
local reach = math.max(1, math.ceil(rate * tonumber(presence_window_s)))
local crossed = 0
if waiting_count > 0 and (edge or waiting_count > reach) then
  local wanted = seq_at(collecting + math.min(reach, waiting_count) - 1)
  if not edge then
    -- A line's first edge, as it outgrows the window: until now eviction took everyone as inside (evict.lua), so
    -- their clocks already run.
    edge = wanted
  elseif tonumber(wanted) > tonumber(edge) then
    local crossing = redis.call('ZRANGEBYSCORE', waiting, '(' .. edge, wanted, 'WITHSCORES', 'LIMIT', 0,
      max_crossings)
    crossed = #crossing / 2
    -- Their clock starts now, unless they polled since (GT keeps a later poll).
    for i = 1, #crossing, 2000 do
      local args = {}
      for n = i, math.min(i + 1999, #crossing), 2 do
        args[#args + 1] = now
        args[#args + 1] = crossing[n]
      end
      redis.call('ZADD', heartbeat, 'GT', unpack(args))
    end
    -- Cut short by the cap, the edge stops at the last place done: the next call goes on from there.
    edge = crossed < tonumber(max_crossings) and wanted or crossing[#crossing]
  end
end
if edge then
  redis.call('SET', window, edge, 'PX', idle_ttl_ms)
end

-- The line's state as a client needs it (docs/api.md#far-back-read-the-line-not-your-place).
local state = 'OPEN'
local held = paused == '1' or sold_out == '1'
if sold_out == '1' then
  state = 'SOLD_OUT'
elseif paused == '1' then
  state = 'PAUSED'
elseif opens_at and now < tonumber(opens_at) then
  state = 'PRE_QUEUE'
elseif opens_at then
  local drawn_for, draw_state = unpack(redis.call('HMGET', draw, 'opens_at_ms', 'state'))
  if drawn_for ~= opens_at or draw_state ~= 'done' then
    state = 'OPENING'
  end
end
if state == 'OPEN' and closes_at and now >= tonumber(closes_at) then
  state = 'CLOSED'
end
-- The shape: the seq of the user with `ahead` users before them, every step of the waiting, the last one too.
local shape = {}
if waiting_count > 0 then
  local step = math.max(1, math.ceil(waiting_count / tonumber(points)))
  for ahead = 0, waiting_count - 1, step do
    shape[#shape + 1] = '["' .. seq_at(collecting + ahead) .. '",' .. ahead .. ']'
  end
  if (waiting_count - 1) % step ~= 0 then
    shape[#shape + 1] = '["' .. seq_at(collecting + waiting_count - 1) .. '",' .. (waiting_count - 1) .. ']'
  end
end
local public = '{"asOfMs":' .. string.format('%d', now) .. ',"state":"' .. state .. '","mark":"' .. mark_text
  .. '","ratePerSec":' .. string.format('%.3f', held and 0 or rate) .. ',"waitingCount":' .. waiting_count
  .. ',"presenceWindowS":' .. presence_window_s .. ',"readCapS":' .. read_cap_s .. ',"shape":['
  .. table.concat(shape, ',') .. ']}'
if publish == '1' and (shards or '1') == '1' then
  redis.call('SET', line, public, 'PX', idle_ttl_ms)
  public = ''
end
return {edge or '0', crossed, waiting_count, public}
