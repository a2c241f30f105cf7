-- Join a lock's queue (run after helpers.lua).
-- KEYS: queue, legacy counter, owners[, lease]. ARGV: member, owner record ('' to store none), '1' when this join
-- may have been sent before ('' on a first attempt: the member cannot exist yet), lease key prefix ('' on a
-- Cluster). Answers {token, 1} (head), {token, 0, member ahead, PTTL of its lease}, {0, 3} when our lease key is
-- gone, or {0, 4, the last member} when that member is of another kind's family (a lock joined as a semaphore...).
-- Joining twice with one member answers the first place.
local q, member, prefix = KEYS[1], ARGV[1], ARGV[4]
local again = ARGV[3] ~= ''
if KEYS[4] and redis.call('EXISTS', KEYS[4]) == 0 then
  if again then remove(q, member, nil, true, true, prefix) end
  return {0, 3}
end
if again then
  local score = redis.call('ZSCORE', q, member)
  if score and kind(member) then return place_kind(q, tonumber(score), member, prefix) end
  if score then return place(q, tonumber(score), prefix, nil) end
end
local now = redis.call('TIME')
local t = tonumber(now[1]) * 1000000 + tonumber(now[2])
local counted, ahead = false, nil
local tail = redis.call('ZRANGE', q, -2, -1, 'WITHSCORES')
for i = 1, #tail, 2 do
  if tail[i] == LAST then counted = true else ahead = tail[i] end
  local s = tonumber(tail[i + 1])
  if s >= t then t = s + 1 end
end
if ahead and family(kind(ahead)) ~= family(kind(member)) then return {0, 4, ahead} end
if not counted then
  local legacy = tonumber(redis.call('GET', KEYS[2]) or '0')
  if legacy >= t then t = legacy + 1 end
end
redis.call('ZADD', q, fmt(t), member, fmt(t), LAST)
if ARGV[2] ~= '' then redis.call('HSET', KEYS[3], member, ARGV[2]) end
if not ahead then return {t, 1} end
if kind(member) then return place_kind(q, t, member, prefix) end
return place(q, t, prefix, ahead)
