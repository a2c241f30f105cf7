-- Which held entries are gone (a self-contained script: no helpers).
-- KEYS: queues. ARGV: member and token of each queue's entry, in turn. Answers the (1-based) indexes of the
-- entries that are gone.
local gone = {}
for i, q in ipairs(KEYS) do
  local score = redis.call('ZSCORE', q, ARGV[2 * i - 1])
  if not score or tonumber(score) ~= tonumber(ARGV[2 * i]) then gone[#gone + 1] = i end
end
return gone
