-- acquire.lua: open a processing idempotency record unless a live one
-- exists, and return the one found, in one atomic step.
--
-- KEYS[1]  the record key, prefix .. "r:{" .. key .. "}"
-- ARGV[1]  the request's fingerprint
-- ARGV[2]  the owner of the new record
-- ARGV[3]  the lease, in milliseconds (PEXPIRE; 0 deletes the record at once)
--
-- A record is a hash: s = "p" (processing) or "c" (completed),
-- f = fingerprint, o = owner, r = response (completed records only),
-- t = when it was opened, in microseconds since the Unix epoch on the
-- server's clock (TIME), kept by renew.lua and complete.lua.
-- A lease that has ended is no record: Redis has expired the key.
--
-- Returns {1} when the record was opened (with ARGV[3] 0, PEXPIRE
-- deletes it at once), else {0, s, f, o, r} for the record found, with
-- "" for a missing field.
local v = redis.call("HMGET", KEYS[1], "s", "f", "o", "r")
if v[1] then
  return {0, v[1], v[2] or "", v[3] or "", v[4] or ""}
end
-- TIME may come before a write: Redis replicates a script's effects, not
-- the script (always since 7.0, by default since 5.0). Its microseconds
-- are padded to six digits.
local now = redis.call("TIME")
local t = now[1] .. string.rep("0", 6 - #now[2]) .. now[2]
redis.call("HSET", KEYS[1], "s", "p", "f", ARGV[1], "o", ARGV[2], "t", t)
redis.call("PEXPIRE", KEYS[1], ARGV[3])
return {1}
