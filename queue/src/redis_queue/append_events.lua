-- A batch of events, one stream entry each, in order. KEYS: each event's stream. ARGV:
-- the streams' length cap, then each event's seq, epoch and data. Every append is tried
-- whatever an earlier one met (as the commands of a pipeline would be); the reply is
-- the first failure, after all were tried, or the number appended.
local failed = nil
for i, key in ipairs(KEYS) do
  local at = 2 + (i - 1) * 3
  local r = redis.pcall('XADD', key, 'MAXLEN', '~', ARGV[1], '*',
    'seq', ARGV[at], 'epoch', ARGV[at + 1], 'data', ARGV[at + 2])
  if type(r) == 'table' and r.err and not failed then
    failed = r.err
  end
end
if failed then
  return redis.error_reply(failed)
end
return #KEYS
