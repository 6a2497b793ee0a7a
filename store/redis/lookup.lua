-- lookup.lua: read a live record with when it was opened and how long it
-- has left, in one atomic step that changes nothing.
--
-- KEYS[1]  the record key, prefix .. "r:{" .. key .. "}", or for a token's
--          record prefix .. "r:{" .. id .. "}t"
--
-- Returns {0} when no live record holds KEYS[1] (a lease that has ended
-- is no record: Redis has expired the key), else
-- {1, s, f, o, r, t, pttl, sec, usec}: the fields of acquire.lua's hash,
-- with "" for a missing one (t is missing from a record opened before
-- it was kept), the key's remaining lifetime in milliseconds (PTTL), and
-- the server's clock (TIME) that this lifetime runs from.
local v = redis.call("HMGET", KEYS[1], "s", "f", "o", "r", "t")
if not v[1] then
  return {0}
end
local now = redis.call("TIME")
return {1, v[1], v[2] or "", v[3] or "", v[4] or "", v[5] or "", redis.call("PTTL", KEYS[1]), now[1], now[2]}
