-- Join a lock's queue (run after helpers.lua).
-- KEYS: queue[, lease]. ARGV: member, owner record ('' to store none), '1' when this join may have been sent before
-- ('' on a first attempt: the member cannot exist yet), lease key prefix ('' on a Cluster), how long the lock's
-- keys must live at least (ms: QUEUE_LIVES lease TTLs). Answers {token, 1} (head), {token, 0, member ahead, PTTL
-- of its lease (or ms until its deadline)}, {0, 3} when our lease key is gone, {0, 4, the last member} when that
-- member is of another kind's family (a lock joined as a semaphore...), or {0, 5, the last member} when that
-- member is of an earlier key layout (nothing joined). Joining twice with one member answers the first place.
local q, member, prefix, want = KEYS[1], ARGV[1], ARGV[4], tonumber(ARGV[5])
local again = ARGV[3] ~= ''
local life = -1
if KEYS[2] then
  life = redis.call('PTTL', KEYS[2])
  if life == -2 then
    if again then remove(q, member, nil, true, true, prefix) end
    return {0, 3}
  end
end
if again then
  local score = redis.call('ZSCORE', q, member)
  if score then
    extend(q, want)
    if kind(member) then return place_kind(q, tonumber(score), member, life, prefix) end
    return place(q, tonumber(score), prefix, nil)
  end
end
local now = now_us()
local t, ahead = now, nil
for i, v in ipairs(redis.call('ZRANGE', q, -2, -1, 'WITHSCORES')) do
  if i % 2 == 1 then
    if v ~= LAST then ahead = v end
  elseif tonumber(v) >= t then
    t = tonumber(v) + 1
  end
end
if ahead and not current(ahead) then return {0, 5, ahead} end
if ahead and family(kind(ahead)) ~= family(kind(member)) then return {0, 4, ahead} end
redis.call('ZADD', q, fmt(t), member, fmt(t), LAST)
-- Without an entry ahead nobody else needs the keys' expiry: set it (long enough for the clock to pass t, too).
if ahead then extend(q, want) else redis.call('PEXPIRE', q, math.max(want, math.floor((t - now) / 1000) + 1)) end
local base = base_of(q)
if ARGV[2] ~= '' then
  redis.call('HSET', base .. 'owners', member, ARGV[2])
  redis.call('PEXPIRE', base .. 'owners', redis.call('PTTL', q))
end
local k = kind(member)
if k then
  redis.call('ZADD', base .. 'd', fmt(math.floor(now / 1000) + life), member)
  if k == 'w' then redis.call('ZADD', base .. 'w', fmt(t), member) end
  local left = redis.call('PTTL', q)
  redis.call('PEXPIRE', base .. 'd', left)
  redis.call('PEXPIRE', base .. 'w', left)
end
if not ahead then return {t, 1} end
if k then return place_kind(q, t, member, life, prefix) end
return place(q, t, prefix, ahead)
