-- budget.lua: not a script of its own. chalicelib/scripts.py puts it before the two scripts that admit: enter.lua
-- (the safety net admits a newcomer at once) and admit.lua (the pump's tick). Both count their admissions against
-- one budget per tick, here and nowhere else, so that together they never pass the rate.
-- tick_budget(key, idle_ttl_ms) gives {take, spent, settle} (below) over the hash `key`:
--   tick       start (ms, Redis time) of the tick `used` counts
--   used       admissions counted against that tick: the net's, and the pump's if it applied that tick
--   pumped     start (ms) of the last tick the pump applied
--   unsettled  the net's admissions in ticks after `pumped`: the pump's next tick admits that many fewer
--   allowed    users per tick the pump admits at while the shop's health holds it below the batch (originSlo)
-- So over the ticks from one applied tick (exclusive) to the next (inclusive), the net and the pump admit at most
-- batch x those ticks, and a tick the pump keeps up with admits at most batch, however they interleave.
local function tick_budget(key, idle_ttl_ms)
  -- One admission now, if the current tick's budget has room for it: true (and counted), else false.
  local function take(now_ms, tick_ms, batch)
    local tick = math.floor(now_ms / tick_ms) * tick_ms
    local held = redis.call('HMGET', key, 'tick', 'used', 'pumped', 'allowed')
    local used = tonumber(held[1]) == tick and tonumber(held[2]) or 0
    if used >= math.floor(math.min(batch, tonumber(held[4] or batch))) then
      return false
    end
    redis.call('HSET', key, 'tick', tick, 'used', used + 1)
    -- Admitted after the pump applied this tick: its tick is settled already, the next one owes nothing for it.
    if not held[3] or tonumber(held[3]) < tick then
      redis.call('HINCRBY', key, 'unsettled', 1)
    end
    redis.call('PEXPIRE', key, idle_ttl_ms)
    return true
  end
  -- What the net admitted in the `covered` ticks up to the one starting at `tick` (ms), which the pump is about to
  -- apply: its tick deducts that. Covering one tick, that tick's own; covering more, all since the last applied
  -- one (more than those ticks' own only when the catch-up cap left some out: the pump then admits less).
  local function spent(tick, covered)
    local held = redis.call('HMGET', key, 'tick', 'used', 'unsettled')
    if covered == 1 then
      return tonumber(held[1]) == tick and tonumber(held[2]) or 0
    end
    return tonumber(held[3] or '0')
  end
  -- The pump applied the tick starting at `tick` (ms) and admitted `admitted`, at `per_tick` users per tick of a
  -- `batch`: the net may add to this tick only what is left of it.
  local function settle(tick, admitted, per_tick, batch)
    local held = redis.call('HMGET', key, 'tick', 'used')
    local used = tonumber(held[1]) == tick and tonumber(held[2]) or 0
    redis.call('HSET', key, 'tick', tick, 'used', used + admitted, 'pumped', tick, 'unsettled', 0)
    if per_tick < batch then
      redis.call('HSET', key, 'allowed', per_tick)
    else
      redis.call('HDEL', key, 'allowed')
    end
    redis.call('PEXPIRE', key, idle_ttl_ms)
  end
  return {take = take, spent = spent, settle = settle}
end
