-- restore.lua: give a consumed entry token back after the purchase failed downstream.
-- KEYS[1] consumed   this token id's one-time marker
-- ARGV[1] the consumption id that consume.lua stored
-- The marker expires with the token, so an expired token has no marker left to delete; and a marker
-- holding another consumption id belongs to a later use, which must stand.
-- Returns 1 if the token is usable again, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
