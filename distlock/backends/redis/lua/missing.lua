-- Which held entries are gone, keeping the others' keys alive (run after helpers.lua).
-- KEYS: queues. ARGV: how long the lock's keys must live at least (ms), the lease's TTL (ms), then member and token
-- of each queue's entry, in turn. Answers the (1-based) indexes of the entries that are gone. An entry found gets
-- its lock's keys extended and, for a semaphore's or read/write lock's, its deadline moved to now + the TTL (the
-- keeper asks this just after refreshing the lease).
local want, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local gone, now = {}, nil
for i, q in ipairs(KEYS) do
  local member = ARGV[2 * i + 1]
  local score = redis.call('ZSCORE', q, member)
  if not score or tonumber(score) ~= tonumber(ARGV[2 * i + 2]) then
    gone[#gone + 1] = i
  else
    extend(q, want)
    if kind(member) then
      now = now or math.floor(now_us() / 1000)
      redis.call('ZADD', base_of(q) .. 'd', 'XX', fmt(now + ttl), member)
    end
  end
end
return gone
