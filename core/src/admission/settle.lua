-- Settle one LLM call: release its concurrency slot, correct its tokens by the usage
-- reported, learn its output size, and record a hold the provider asked for.
-- KEYS[1]: the hash of learned output averages; KEYS[2]: the hash of holds;
-- KEYS[3..]: the prefixes of the rules the call was reserved under.
-- ARGV: reservation id, total tokens used (-1 unknown), output tokens (-1 unknown),
--       the average's field, the hold's field, hold until ms (0 none), now_ms, then
--       what the answer announced: requests left and their reset ms, tokens left and
--       their reset ms (-1 unknown), the keys of those two counters, then the limits
--       announced (requests, tokens; -1 unknown) and the key of their hash.
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
local rl, rr, tl, tr = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
if rl >= 0 and rr > 0 then
  redis.call('SET', ARGV[12], rl, 'PX', rr)
end
if tl >= 0 and tr > 0 then
  redis.call('SET', ARGV[13], tl, 'PX', tr)
end
local lr, lt = tonumber(ARGV[14]), tonumber(ARGV[15])
if lr > 0 and rr > 0 then
  local w = math.max(rr, tonumber(redis.call('HGET', ARGV[16], 'window_r') or '0'))
  redis.call('HSET', ARGV[16], 'limit_r', lr, 'window_r', math.min(w, 3600000))
end
if lt > 0 and tr > 0 then
  local w = math.max(tr, tonumber(redis.call('HGET', ARGV[16], 'window_t') or '0'))
  redis.call('HSET', ARGV[16], 'limit_t', lt, 'window_t', math.min(w, 3600000))
end
redis.call('PEXPIRE', ARGV[16], 3600000)
if rl >= 0 or tl >= 0 then
  redis.call('HSET', KEYS[2] .. ':announced', ARGV[5], now)
end
return 1
