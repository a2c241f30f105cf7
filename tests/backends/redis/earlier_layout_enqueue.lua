-- The join of distlock's earlier Redis key layout (layout 2: members without a layout mark, '~token' never
-- deleted): helpers.lua and enqueue.lua as they were at commit 69ef0eb, for tests/backends/redis/test_redis_residue.py's
-- rolling-upgrade test. Run it after the line: local LAST, WAKE_TTL_MS = '~token', 600000
-- The helpers the queue scripts share (enqueue, position, remove, head): _scripts.py puts this file in front of
-- each of them when it loads them, after one line that defines LAST (the queue's last member, '~token', whose
-- score is the last token handed out) and WAKE_TTL_MS (how long a wake-up waits in its list) from the Python
-- constants of the same names.
--
-- q is a lock's queue key '<prefix>:{E}:q'; the lock's other keys ('owners', 'wake:<member>') share its start
-- (base_of). prefix is what goes before a member's lease hex to name its lease key: '' on a Cluster, where a
-- script may not read another slot's key.
-- Tokens are integers below 2^53 (microseconds since 1970 stay below it until the year 2255), so Lua's doubles
-- hold them exactly; they are formatted with %.0f wherever they become a string, and returned as numbers.
local function fmt(n) return string.format('%.0f', n) end
local function base_of(q) return string.sub(q, 1, -2) end
local function lease_key(prefix, member) return prefix .. string.match(member, '^[^-]*') end
-- Take an entry out with, when asked, its owner record and its wake-up list: nobody is woken.
local function drop(q, member, owner, wake)
  redis.call('ZREM', q, member)
  if owner then redis.call('HDEL', base_of(q) .. 'owners', member) end
  if wake then redis.call('DEL', base_of(q) .. 'wake:' .. member) end
end
-- Wake a waiter: 'h' (you hold the lock) goes first, '1' (look again) last; the list dies with its entry.
local function notify(q, member, news)
  local key = base_of(q) .. 'wake:' .. member
  if news == 'h' then redis.call('LPUSH', key, news) else redis.call('RPUSH', key, news) end
  redis.call('PEXPIRE', key, WAKE_TTL_MS)
end
-- The head left: tell the next waiter it holds the lock, after checking its lease where the script may read it
-- (prefix '' on a Cluster). A waiter whose lease is gone is taken out on the way and told to look again: if its
-- client lives on (its lease deleted behind its back), it learns at once that it must queue again.
local function hand_over(q, nxt, prefix)
  for i = 1, 16 do
    if not nxt or nxt == LAST then return end
    if prefix == '' or redis.call('EXISTS', lease_key(prefix, nxt)) == 1 then
      notify(q, nxt, 'h')
      return
    end
    drop(q, nxt, true, false)
    notify(q, nxt, '1')
    nxt = redis.call('ZRANGE', q, 0, 0)[1]
  end
  if nxt and nxt ~= LAST then notify(q, nxt, '1') end
end
-- The kind of an entry (see distlock/_shape.py): nil for a lock's, 'sN' a semaphore slot of limit N, 'r'/'w' a
-- reader/writer. An entry holds when fewer than its limit of the entries ahead conflict with it.
local function kind(member) return string.match(member, '^[^-]*%-(%w+)%.') end
local function family(k)
  if k == 'r' or k == 'w' then return 'rw' end
  return k or ''
end
local function limit(k)
  if k and string.sub(k, 1, 1) == 's' then return tonumber(string.sub(k, 2)) end
  return 1
end
local function conflicts(behind, ahead) return not (behind == 'r' and ahead == 'r') end
-- A semaphore's or read/write lock's entry left at score s: wake every entry it kept from holding, now holding (the
-- walk from the head stops at the first entry that waits: everything behind it waits too). A wake-up goes only
-- to an entry whose lease lives; a dead one is removed by the next waiter that reads its place.
local function wake_kinds(q, gone, s, prefix)
  local entries, writers, start = 0, 0, 0
  while true do
    local chunk = redis.call('ZRANGE', q, start, start + 63, 'WITHSCORES')
    if #chunk == 0 then return end
    for i = 1, #chunk, 2 do
      local m = chunk[i]
      if m == LAST then return end
      local k = kind(m)
      local ahead = entries
      if k == 'r' then ahead = writers end
      if ahead >= limit(k) then return end
      if tonumber(chunk[i + 1]) > s and ahead + 1 >= limit(k) and conflicts(k, gone)
        and (prefix == '' or redis.call('EXISTS', lease_key(prefix, m)) == 1) then
        notify(q, m, 'h')
      end
      entries = entries + 1
      if k ~= 'r' then writers = writers + 1 end
    end
    start = start + 64
  end
end
-- Where entry member (at token t) of a semaphore or read/write lock stands: {t, 1} when it holds, else {t, 0, the
-- conflicting entry ahead whose lease ends first, PTTL of that lease}. Entries ahead whose lease is gone are taken
-- out (a waiter they kept waiting wakes by its own PTTL, which was theirs at most).
local function place_kind(q, t, member, prefix)
  local k = kind(member)
  local n, on, pttl = 0, nil, nil
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', q, '-inf', '(' .. fmt(t))) do
    if m ~= LAST then
      local left = redis.call('PTTL', lease_key(prefix, m))
      if left == -2 then
        drop(q, m, true, true)
      elseif conflicts(k, kind(m)) then
        n = n + 1
        if not pttl or (left >= 0 and (pttl < 0 or left < pttl)) then on, pttl = m, left end
      end
    end
  end
  if n < limit(k) then return {t, 1} end
  return {t, 0, on, pttl}
end
-- Remove member (only at token t, when t is given) and wake the waiter behind it. 1 if removed.
local function remove(q, member, t, owner, wake, prefix)
  local k = kind(member)
  if k then
    local score = redis.call('ZSCORE', q, member)
    if not score or (t and tonumber(score) ~= t) then return 0 end
    drop(q, member, owner, wake)
    wake_kinds(q, k, tonumber(score), prefix)
    return 1
  end
  local first = redis.call('ZRANGE', q, 0, 1, 'WITHSCORES')
  if first[1] == member then
    if t and tonumber(first[2]) ~= t then return 0 end
    drop(q, member, owner, wake)
    hand_over(q, first[3], prefix)
    return 1
  end
  local score = redis.call('ZSCORE', q, member)
  if not score or (t and tonumber(score) ~= t) then return 0 end
  local behind = redis.call('ZRANGEBYSCORE', q, '(' .. fmt(tonumber(score)), '+inf', 'LIMIT', 0, 1)
  drop(q, member, owner, wake)
  if behind[1] and behind[1] ~= LAST then notify(q, behind[1], '1') end
  return 1
end
-- Where the entry at token t stands: {t, 1} at the head, else {t, 0, member ahead, PTTL of its lease} (-3: not
-- read, on a Cluster). A waiter ahead whose lease is gone is taken out first (nobody to wake: we are behind it).
local function place(q, t, prefix, ahead)
  for i = 1, 16 do
    if not ahead then
      ahead = redis.call('ZREVRANGEBYSCORE', q, '(' .. fmt(t), '-inf', 'LIMIT', 0, 1)[1]
      if not ahead then return {t, 1} end
    end
    if prefix == '' then return {t, 0, ahead, -3} end
    local pttl = redis.call('PTTL', lease_key(prefix, ahead))
    if pttl ~= -2 or i == 16 then return {t, 0, ahead, pttl} end
    drop(q, ahead, true, true)
    ahead = nil
  end
end
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
