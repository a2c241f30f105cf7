-- Set the lock's record, only for its holder (a self-contained script: no helpers).
-- KEYS: queue, record[, lease]. ARGV: member, token, value. Answers 1 when the entry is still in the queue with
-- that token (and its lease key exists, when given) and the record was set; else 0.
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then return 0 end
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[3])
return 1
