-- Who holds the lock (run after helpers.lua).
-- KEYS: queue, owners. Answers {} or {member, token, entries that wait, owner record, entries that hold}: those
-- that hold are counted by the grant rule from the head (a semaphore's slots and readers hold together; the walk
-- stops at the first entry that waits, and everything behind it waits too).
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #head == 0 or head[1] == LAST then return {} end
local entries = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], LAST) then entries = entries - 1 end
local holders, writers, start = 0, 0, 0
while holders == start do
  local chunk = redis.call('ZRANGE', KEYS[1], start, start + 63)
  for _, m in ipairs(chunk) do
    if m == LAST then break end
    local k = kind(m)
    local ahead = holders
    if k == 'r' then ahead = writers end
    if ahead >= limit(k) then break end
    holders = holders + 1
    if k ~= 'r' then writers = writers + 1 end
  end
  if #chunk < 64 then break end
  start = start + 64
end
return {head[1], tonumber(head[2]), entries - holders, redis.call('HGET', KEYS[2], head[1]) or '', holders}
