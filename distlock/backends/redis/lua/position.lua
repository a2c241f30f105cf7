-- Where an entry stands now (run after helpers.lua).
-- KEYS: queue[, lease]. ARGV: member, token, lease key prefix, how long the lock's keys must live at least (ms).
-- Answers like enqueue.lua, or {0, 2} when the entry is gone (or its lease is: then the entry is removed).
local q, member, t = KEYS[1], ARGV[1], tonumber(ARGV[2])
local score = redis.call('ZSCORE', q, member)
if not score or tonumber(score) ~= t then return {0, 2} end
local life = -1
if KEYS[2] then
  life = redis.call('PTTL', KEYS[2])
  if life == -2 then
    remove(q, member, t, true, true, ARGV[3])
    return {0, 2}
  end
end
extend(q, tonumber(ARGV[4]))
if kind(member) then return place_kind(q, t, member, life, ARGV[3]) end
return place(q, t, ARGV[3], nil)
