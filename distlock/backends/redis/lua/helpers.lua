-- The helpers the queue scripts share (enqueue, position, remove, head, keep_alive): _scripts.py puts this file in
-- front of each of them when it loads them, after one line that defines LAST (the queue's last member, '~token',
-- whose score is the last token handed out), WAKE_TTL_MS (how long a wake-up waits in its list when its queue has
-- no expiry: a queue of an earlier layout) and TAG (the layout mark after a member's lease hex) from the Python
-- constants of the same names.
--
-- q is a lock's queue key '<prefix>:{E}:q'; the lock's other keys share its start (base_of): 'owners' (owner
-- records), 'd' (a semaphore's or read/write lock's lease deadlines, ms), 'w' (a read/write lock's writers, by
-- token) and 'wake:<member>'. They live as long as the queue: every key of a lock expires with it, and the last
-- removal deletes them all (bury). prefix is what goes before a member's lease hex to name its lease key: '' on a
-- Cluster, where a script may not read another slot's key.
-- Tokens are integers below 2^53 (microseconds since 1970 stay below it until the year 2255), so Lua's doubles
-- hold them exactly; they are formatted with %.0f wherever they become a string, and returned as numbers.
local function fmt(n) return string.format('%.0f', n) end
local function base_of(q) return string.sub(q, 1, -2) end
local function lease_key(prefix, member) return prefix .. string.match(member, '^[^-]*') end
local function now_us()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000000 + tonumber(now[2])
end
-- The member's nonce, without the layout mark; whether the member is of this layout; its kind (distlock/_shape.py):
-- nil for a lock's, 'sN' a semaphore slot of limit N, 'r'/'w' a reader/writer.
local MARKED = '^[^-]*%-' .. TAG .. '%.(.*)$'
local function current(member) return string.match(member, MARKED) ~= nil end
local function nonce(member) return string.match(member, MARKED) or string.match(member, '^[^-]*%-(.*)$') or '' end
local function kind(member) return string.match(nonce(member), '^(%w+)%.') end
local function family(k)
  if k == 'r' or k == 'w' then return 'rw' end
  return k or ''
end
-- A semaphore slot's kind (of any limit, 1 too); its limit (1 for any other kind).
local function slot(k) return k ~= nil and string.sub(k, 1, 1) == 's' end
local function limit(k)
  if slot(k) then return tonumber(string.sub(k, 2)) end
  return 1
end
-- Keep the lock's keys for at least 2/3 of want ms more (want: QUEUE_LIVES lease TTLs of the caller); never
-- shortened, set on all of them at once. Answers the queue's TTL now.
local function extend(q, want)
  local left = redis.call('PTTL', q)
  if left >= 0 and left * 3 >= want * 2 then return left end
  local base = base_of(q)
  redis.call('PEXPIRE', q, want)
  redis.call('PEXPIRE', base .. 'owners', want)
  redis.call('PEXPIRE', base .. 'd', want)
  redis.call('PEXPIRE', base .. 'w', want)
  return want
end
-- The lock's last entry left (the last token s, or nil to read it): delete every key of the lock, with member and
-- wake_key (the leaving entry and its wake-up list) when given. The last token stays (the queue with '~token'
-- alone, expiring when the server clock passes it) only when it is not behind the clock, so that the next token,
-- the clock's, is larger. A queue that still has entries is left alone.
local function bury(q, s, member, wake_key)
  if not s then
    local n = redis.call('ZCARD', q)
    if n > 1 then return end
    s = redis.call('ZSCORE', q, LAST)
    if not s and n == 1 then return end  -- an entry of a layout without '~token'
    s = tonumber(s or 0)
  end
  local base = base_of(q)
  local keys = {base .. 'owners', base .. 'd', base .. 'w'}
  if wake_key then keys[#keys + 1] = wake_key end
  local ahead_us = s - now_us()
  if ahead_us < 0 then
    keys[#keys + 1] = q
  else
    if member then redis.call('ZREM', q, member) end
    redis.call('PEXPIRE', q, math.floor(ahead_us / 1000) + 1)
  end
  redis.call('DEL', unpack(keys))
end
-- Take an entry out with, when asked, its owner record and its wake-up list (always for a semaphore's or read/write
-- lock's entry, which may be told it holds while it joins, by its own removal of a dead entry): nobody is woken.
local function drop(q, member, owner, wake)
  local base = base_of(q)
  local k = kind(member)
  redis.call('ZREM', q, member)
  if owner then redis.call('HDEL', base .. 'owners', member) end
  if wake or k then redis.call('DEL', base .. 'wake:' .. member) end
  if k then redis.call('ZREM', base .. 'd', member) end
  if k == 'w' then redis.call('ZREM', base .. 'w', member) end
end
-- Wake a waiter: 'h' (you hold the lock) goes first, '1' (look again) last; the list dies with its entry, or with
-- the queue.
local function notify(q, member, news)
  local key = base_of(q) .. 'wake:' .. member
  if news == 'h' then redis.call('LPUSH', key, news) else redis.call('RPUSH', key, news) end
  local left = redis.call('PTTL', q)
  if left < 0 then left = WAKE_TTL_MS end
  redis.call('PEXPIRE', key, left)
end
-- Tell a waiter that it holds now, if its lease lives where the script may read it (prefix '' on a Cluster). A
-- waiter whose lease is gone is taken out with its wake-up list (its client, if alive, learns it from its own
-- keeper, or at the end of its wait). Answers whether it was told.
local function admit(q, member, prefix)
  if prefix == '' or redis.call('EXISTS', lease_key(prefix, member)) == 1 then
    notify(q, member, 'h')
    return true
  end
  drop(q, member, true, true)
  return false
end
-- The head left: hand the lock to the next live waiter; a queue left empty is buried.
local function hand_over(q, nxt, prefix)
  for i = 1, 16 do
    if not nxt or nxt == LAST then return bury(q, nil, nil, nil) end
    if admit(q, nxt, prefix) then return end
    nxt = redis.call('ZRANGE', q, 0, 0)[1]
  end
  if nxt and nxt ~= LAST then notify(q, nxt, '1') end
end
-- A semaphore's or read/write lock's entry of kind k left at score s (rank r in the queue before, for a
-- semaphore): tell each entry it let in that it holds now. A semaphore slot lets in the entry that was first to
-- wait; a reader, the writer now at the head; a writer, that too, or the readers up to the next writer when it was
-- the first writer. Each is a read of the entries let in, not a walk over those that hold.
local function let_in(q, k, s, r, prefix)
  if slot(k) then
    if r >= limit(k) then return end
    for i = 1, 16 do
      local nxt = redis.call('ZRANGE', q, limit(k) - 1, limit(k) - 1)[1]
      if not nxt or nxt == LAST or admit(q, nxt, prefix) then return end
    end
    return
  end
  local head = redis.call('ZRANGE', q, 0, 0, 'WITHSCORES')
  if head[1] and head[1] ~= LAST and kind(head[1]) == 'w' then
    if tonumber(head[2]) > s then admit(q, head[1], prefix) end
    return
  end
  if k ~= 'w' then return end
  local first = redis.call('ZRANGE', base_of(q) .. 'w', 0, 0, 'WITHSCORES')
  if first[1] and tonumber(first[2]) < s then return end
  local upto = '+inf'
  if first[1] then upto = '(' .. first[2] end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', q, '(' .. fmt(s), upto)) do
    if m ~= LAST then admit(q, m, prefix) end
  end
end
-- Remove member (only at token t, when t is given) and wake whom that lets in; bury the lock when it was the last
-- entry. 1 if removed.
local function remove(q, member, t, owner, wake, prefix)
  local k = kind(member)
  if k then
    local score = redis.call('ZSCORE', q, member)
    if not score or (t and tonumber(score) ~= t) then return 0 end
    local r = nil
    if slot(k) then r = redis.call('ZRANK', q, member) end
    drop(q, member, owner, wake)
    -- An entry of an earlier layout has no deadline or writer index to go by: its waiters look again by their own
    -- deadlines.
    if current(member) then let_in(q, k, tonumber(score), r, prefix) end
    bury(q, nil, nil, nil)
    return 1
  end
  local first = redis.call('ZRANGE', q, 0, 1, 'WITHSCORES')
  if first[1] == member then
    if t and tonumber(first[2]) ~= t then return 0 end
    if first[3] == LAST then
      local wake_key = nil
      if wake then wake_key = base_of(q) .. 'wake:' .. member end
      bury(q, tonumber(first[4]), member, wake_key)
      return 1
    end
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
-- Where entry member (at token t) of a semaphore or read/write lock stands (one server only: prefix is set), after
-- recording its lease's deadline (now_ms + life) and removing entries whose lease ended, found by their deadlines
-- (at most 16 a call; one whose lease was renewed gets its new deadline): {t, 1} when it holds, else {t, 0, an
-- entry it waits for, ms until that entry's deadline}. A slot waits for the earliest deadline of the others, a
-- writer for the entry just ahead, a reader for the newest writer ahead; every removal wakes whom it lets in.
local function place_kind(q, t, member, life, prefix)
  local base = base_of(q)
  local d = base .. 'd'
  local now = math.floor(now_us() / 1000)
  if life >= 0 then redis.call('ZADD', d, 'XX', fmt(now + life), member) end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', d, '-inf', fmt(now), 'LIMIT', 0, 16)) do
    local left = redis.call('PTTL', lease_key(prefix, m))
    if left == -2 then
      if remove(q, m, nil, true, true, prefix) == 0 then redis.call('ZREM', d, m) end
    else
      if left < 0 then left = 86400000 end
      redis.call('ZADD', d, fmt(now + left), m)
    end
  end
  local k = kind(member)
  local on = nil
  if slot(k) then
    if redis.call('ZRANK', q, member) < limit(k) then return {t, 1} end
    local first = redis.call('ZRANGE', d, 0, 1)
    on = first[1]
    if on == member then on = first[2] end
  elseif k == 'w' then
    on = redis.call('ZREVRANGEBYSCORE', q, '(' .. fmt(t), '-inf', 'LIMIT', 0, 1)[1]
  else
    on = redis.call('ZREVRANGEBYSCORE', base .. 'w', '(' .. fmt(t), '-inf', 'LIMIT', 0, 1)[1]
  end
  if not on then return {t, 1} end
  local until_ms = tonumber(redis.call('ZSCORE', d, on) or now) - now
  if until_ms < 0 then until_ms = 0 end
  return {t, 0, on, until_ms}
end
