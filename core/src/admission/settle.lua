-- Settle one LLM call: release its concurrency slot, correct its tokens by the usage
-- reported, learn its output size, and record a hold the provider asked for.
-- KEYS[1]: the hash of learned output averages; KEYS[2]: the hash of holds;
-- KEYS[3..]: the prefixes of the rules the call was reserved under.
-- ARGV: reservation id, total tokens used (-1 unknown), output tokens (-1 unknown),
--       the average's field, the hold's field, hold until ms (0 none), now_ms.
local id = ARGV[1]
local used = tonumber(ARGV[2])
local out = tonumber(ARGV[3])
local hold = tonumber(ARGV[6])
local now = tonumber(ARGV[7])
for i = 3, #KEYS do
  local k = KEYS[i]
  redis.call('ZREM', k .. ':c', id)
  if used >= 0 then
    local was = tonumber(redis.call('HGET', k .. ':tk', id))
    if was then
      redis.call('HSET', k .. ':tk', id, used)
      redis.call('INCRBY', k .. ':tt', used - was)
    end
  end
end
if out >= 0 and #KEYS > 2 then
  local a = tonumber(redis.call('HGET', KEYS[1], ARGV[4]) or '')
  if a then a = a * 0.8 + out * 0.2 else a = out end
  redis.call('HSET', KEYS[1], ARGV[4], a)
end
local cur = tonumber(redis.call('HGET', KEYS[2], ARGV[5]) or '0')
if hold > now and hold > cur then
  redis.call('HSET', KEYS[2], ARGV[5], hold)
elseif cur > 0 and cur <= now then
  redis.call('HDEL', KEYS[2], ARGV[5])
end
return 1
