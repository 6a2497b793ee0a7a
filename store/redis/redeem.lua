-- redeem.lua: compare a stored token with the presented one and delete it
-- only when both purpose and subject match, in one atomic step. A token
-- with a live record (redeem_record.lua) is taken: absent.
--
-- KEYS[1]  the token key, prefix .. "t:{" .. id .. "}"
-- KEYS[2]  the token's record key, prefix .. "r:{" .. id .. "}t"
-- ARGV[1]  the expected value, purpose .. "\n" .. subject
-- ARGV[2]  the expected purpose followed by "\n"; empty when the presented
--          purpose cannot match any stored one (it contains a newline)
--
-- Returns 0 absent, 1 redeemed, 2 purpose mismatch, 3 subject mismatch.
-- Only a return of 1 changes anything.
if redis.call("EXISTS", KEYS[2]) == 1 then
  return 0
end
local v = redis.call("GET", KEYS[1])
if not v then
  return 0
end
if v == ARGV[1] then
  redis.call("DEL", KEYS[1])
  return 1
end
local p = ARGV[2]
if #p > 0 and string.sub(v, 1, #p) == p then
  return 3
end
return 2
