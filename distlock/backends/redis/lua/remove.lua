-- Take an entry out and wake whom that lets in: a release, give-up, eviction or force release (run after
-- helpers.lua).
-- KEYS: queue. ARGV: member, token (or '' for any), '1' to delete its owner record, '1' to delete its wake-up
-- list, lease key prefix. Answers 1 if removed.
local t = nil
if ARGV[2] ~= '' then t = tonumber(ARGV[2]) end
return remove(KEYS[1], ARGV[1], t, ARGV[3] ~= '', ARGV[4] ~= '', ARGV[5])
