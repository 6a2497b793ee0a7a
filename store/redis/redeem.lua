-- redeem.lua: redeem a token and open the record of the execution
-- it starts, or answer from the record it already has, in one atomic step.
--
-- KEYS[1]  the token key, prefix .. "t:{" .. id .. "}"
-- KEYS[2]  the token's record key, prefix .. "r:{" .. id .. "}t"
-- ARGV[1]  the expected value, purpose .. "\n" .. subject, which is also
--          the record's fingerprint
-- ARGV[2]  the expected purpose followed by "\n"; empty when the presented
--          purpose cannot match any stored one (it contains a newline)
-- ARGV[3]  the owner of a new record; empty to redeem without a record
-- ARGV[4]  the lease, in milliseconds (PEXPIRE; 0 deletes the record at once)
--
-- The record is a hash like acquire.lua's: s = "p" or "c", f = the
-- fingerprint, o = the owner, r = the response, t = when it was opened
-- (microseconds, the server's TIME).
--
-- Returns {0} absent, {1} redeemed, {2} purpose mismatch, {3} subject
-- mismatch, or {4, s, f, o, r} for the live record found. Only {1}
-- changes anything: with an owner the token is kept and a processing
-- record opened (an ARGV[4] of 0 deletes it at once), without one the
-- token is deleted.
local function mismatch(v)
  local p = ARGV[2]
  if #p > 0 and string.sub(v, 1, #p) == p then
    return {3}
  end
  return {2}
end
local r = redis.call("HMGET", KEYS[2], "s", "f", "o", "r")
if r[1] then
  local f = r[2] or ""
  if f ~= ARGV[1] then
    return mismatch(f)
  end
  return {4, r[1], f, r[3] or "", r[4] or ""}
end
local v = redis.call("GET", KEYS[1])
if not v then
  return {0}
end
if v ~= ARGV[1] then
  return mismatch(v)
end
if ARGV[3] == "" then
  redis.call("DEL", KEYS[1])
  return {1}
end
local now = redis.call("TIME") -- as in acquire.lua
local t = now[1] .. string.rep("0", 6 - #now[2]) .. now[2]
redis.call("HSET", KEYS[2], "s", "p", "f", ARGV[1], "o", ARGV[3], "t", t)
redis.call("PEXPIRE", KEYS[2], ARGV[4])
return {1}
