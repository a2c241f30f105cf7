-- Refresh a lease and keep alive the locks it is queued in (run after helpers.lua).
-- KEYS: the lease key when ARGV[1] is '1' (on a Cluster it has another slot: then ARGV[1] is '' and only queues of
-- one slot are given), then queues. ARGV: '1' or '', the lease's TTL (ms), how long a lock's keys must live at least
-- (ms), then member and token of each queue's entry, in turn. Answers 0, touching nothing, when the lease is gone,
-- else 1. An entry found gets its lock's keys extended (never shortened) and, for a semaphore's or read/write
-- lock's, its deadline moved to now + the TTL; an entry not found is left to the keeper's check of held locks.
local ttl, want = tonumber(ARGV[2]), tonumber(ARGV[3])
local first = 1
if ARGV[1] == '1' then
  if redis.call('PEXPIRE', KEYS[1], ttl) == 0 then return 0 end
  first = 2
end
local now = nil
for i = first, #KEYS do
  local q, at = KEYS[i], 2 * (i - first) + 4
  local member = ARGV[at]
  local score = redis.call('ZSCORE', q, member)
  if score and tonumber(score) == tonumber(ARGV[at + 1]) then
    extend(q, want)
    if kind(member) then
      now = now or math.floor(now_us() / 1000)
      redis.call('ZADD', base_of(q) .. 'd', 'XX', fmt(now + ttl), member)
    end
  end
end
return 1
