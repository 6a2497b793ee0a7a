-- complete.lua: turn an owner's processing record into a completed one
-- holding the response, kept until a new expiry, in one atomic step.
--
-- KEYS[1]  the record key, prefix .. "r:{" .. key .. "}", or for a token's
--          record prefix .. "r:{" .. id .. "}t"
-- KEYS[2]  for a token's record only: the token key,
--          prefix .. "t:{" .. id .. "}", deleted with the completion so
--          that the token cannot come back when the record expires
-- ARGV[1]  the owner; empty for any owner
-- ARGV[2]  the response, any bytes
-- ARGV[3]  the retention, in milliseconds (PEXPIRE); it replaces the
--          lease
--
-- Returns 1 when the record was processing and held by ARGV[1] (with an
-- ARGV[3] of 0, PEXPIRE deletes it), else 0 and changes nothing.
local v = redis.call("HMGET", KEYS[1], "s", "o")
if v[1] ~= "p" or (ARGV[1] ~= "" and v[2] ~= ARGV[1]) then
  return 0
end
redis.call("HSET", KEYS[1], "s", "c", "r", ARGV[2])
redis.call("PEXPIRE", KEYS[1], ARGV[3])
if KEYS[2] then
  redis.call("DEL", KEYS[2])
end
return 1
