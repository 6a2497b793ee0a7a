-- release.lua: delete an owner's processing record so that a retry runs,
-- in one atomic step.
--
-- KEYS[1]  the record key, prefix .. "r:{" .. key .. "}"
-- ARGV[1]  the owner; empty for any owner
--
-- Returns 1 when the record was processing, held by ARGV[1] and is now
-- deleted, else 0 and changes nothing.
local v = redis.call("HMGET", KEYS[1], "s", "o")
if v[1] ~= "p" or (ARGV[1] ~= "" and v[2] ~= ARGV[1]) then
  return 0
end
redis.call("DEL", KEYS[1])
return 1
