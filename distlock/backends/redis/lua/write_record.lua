-- Set the lock's record, or one of its marks, only for its holder (a self-contained script: no helpers).
-- KEYS: queue, record or mark[, lease]. ARGV: member, token, value[, a mark's TTL in ms]. Answers 1 when the entry
-- is still in the queue with that token (and its lease key exists, when given) and the value was set (to expire
-- with the TTL, when given); else 0.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then return 0 end
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 0 then return 0 end
if ARGV[4] then
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
else
  redis.call('SET', KEYS[2], ARGV[3])
end
return 1
