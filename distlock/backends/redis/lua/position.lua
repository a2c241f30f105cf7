-- Where an entry stands now (run after helpers.lua).
-- KEYS: queue[, lease]. ARGV: member, token, lease key prefix. Answers like enqueue.lua, or {0, 2} when the entry
-- is gone (or its lease is: then the entry is removed).
local q, member, t = KEYS[1], ARGV[1], tonumber(ARGV[2])
local score = redis.call('ZSCORE', q, member)
if not score or tonumber(score) ~= t then return {0, 2} end
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 0 then
  remove(q, member, t, true, true, ARGV[3])
  return {0, 2}
end
if kind(member) then return place_kind(q, t, member, ARGV[3]) end
return place(q, t, ARGV[3], nil)
