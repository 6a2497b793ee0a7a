-- renew.lua: move the end of an owner's processing lease, in one atomic
-- step.
--
-- KEYS[1]  the record key, prefix .. "r:{" .. key .. "}"
-- ARGV[1]  the owner
-- ARGV[2]  the new lease, in milliseconds (PEXPIRE; 0 ends the record at once)
--
-- Returns 1 when the record was processing and held by ARGV[1] (with an
-- ARGV[2] of 0, PEXPIRE deletes it), else 0 and changes nothing.
local v = redis.call("HMGET", KEYS[1], "s", "o")
if v[1] ~= "p" or v[2] ~= ARGV[1] then
  return 0
end
redis.call("PEXPIRE", KEYS[1], ARGV[2])
return 1
