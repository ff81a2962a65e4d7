-- restore.lua: give a consumed entry token back after the purchase failed downstream.
-- KEYS[1] consumed   this token id's one-time marker
-- KEYS[2] active     zset: user id -> expiry (ms) of their issued, unconsumed entry token (for maxActive)
-- ARGV[1] the consumption id that consume.lua stored   ARGV[2] the token's user id   ARGV[3] its expiry (epoch ms)
-- The marker expires with the token, so an expired token has no marker left to delete; and a marker
-- holding another consumption id belongs to a later use, which must stand.
-- Returns 1 if the token is usable again, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
  return redis.call('DEL', KEYS[1])
end
return 0
