-- Reserve one LLM call against every limit rule it falls under, atomically.
-- KEYS[1]: the hash of learned output averages; KEYS[2]: the index of rule keys;
-- KEYS[3..]: one prefix per rule.
-- ARGV: now_ms, reservation id, reservation ttl_ms, input tokens, max output tokens,
--       the average's field, then per rule: requests, tokens, concurrency, window_ms
--       (0 = no such limit).
-- Returns {1, reserved tokens, ''} or {0, wait ms, reason}.
local now = tonumber(ARGV[1])
local id = ARGV[2]
local ttl = tonumber(ARGV[3])
local input = tonumber(ARGV[4])
local maxout = tonumber(ARGV[5])
local out = maxout
local avg = tonumber(redis.call('HGET', KEYS[1], ARGV[6]) or '')
if avg then
  -- A learned average with headroom, never more than the request allows.
  out = math.min(maxout, math.ceil(avg * 1.5) + 16)
end
local tokens = input + out
local wait = 0
local reason = ''
local function later(w, why)
  if w > wait then
    wait = w
    reason = why
  end
end
local rules = #KEYS - 2
for i = 1, rules do
  local k = KEYS[i + 2]
  local b = 6 + (i - 1) * 4
  local rpm = tonumber(ARGV[b + 1])
  local tpm = tonumber(ARGV[b + 2])
  local conc = tonumber(ARGV[b + 3])
  local win = tonumber(ARGV[b + 4])
  if conc > 0 then
    -- Reservations of workers that died expire here.
    redis.call('ZREMRANGEBYSCORE', k .. ':c', '-inf', now)
    if redis.call('ZCARD', k .. ':c') >= conc then
      local first = redis.call('ZRANGE', k .. ':c', 0, 0, 'WITHSCORES')
      -- A slot frees when a call settles, which no score tells: look again soon.
      later(math.max(1, math.min(tonumber(first[2]) - now, 50)), 'concurrency')
    end
  end
  if rpm > 0 then
    redis.call('ZREMRANGEBYSCORE', k .. ':r', '-inf', now - win)
    if redis.call('ZCARD', k .. ':r') >= rpm then
      local first = redis.call('ZRANGE', k .. ':r', 0, 0, 'WITHSCORES')
      later(math.max(1, tonumber(first[2]) + win - now), 'rpm')
    end
  end
  if tpm > 0 then
    local old = redis.call('ZRANGEBYSCORE', k .. ':t', '-inf', now - win)
    if #old > 0 then
      local sum = 0
      for j = 1, #old do
        sum = sum + (tonumber(redis.call('HGET', k .. ':tk', old[j])) or 0)
        redis.call('HDEL', k .. ':tk', old[j])
      end
      redis.call('DECRBY', k .. ':tt', sum)
      redis.call('ZREMRANGEBYSCORE', k .. ':t', '-inf', now - win)
    end
    local total = tonumber(redis.call('GET', k .. ':tt') or '0')
    -- A call larger than the whole allowance goes alone, into an empty window.
    if total > 0 and total + tokens > tpm then
      local need = total + tokens - tpm
      local entries = redis.call('ZRANGE', k .. ':t', 0, -1, 'WITHSCORES')
      local freed = 0
      local w = win
      for j = 1, #entries, 2 do
        freed = freed + (tonumber(redis.call('HGET', k .. ':tk', entries[j])) or 0)
        if freed >= need then
          w = tonumber(entries[j + 1]) + win - now
          break
        end
      end
      later(math.max(1, w), 'tpm')
    end
  end
end
if wait > 0 then
  return {0, math.ceil(wait), reason}
end
for i = 1, rules do
  local k = KEYS[i + 2]
  local b = 6 + (i - 1) * 4
  local rpm = tonumber(ARGV[b + 1])
  local tpm = tonumber(ARGV[b + 2])
  local conc = tonumber(ARGV[b + 3])
  local win = tonumber(ARGV[b + 4])
  local keep = win + ttl
  if conc > 0 then
    redis.call('ZADD', k .. ':c', now + ttl, id)
    redis.call('PEXPIRE', k .. ':c', keep)
  end
  if rpm > 0 then
    redis.call('ZADD', k .. ':r', now, id)
    redis.call('PEXPIRE', k .. ':r', keep)
  end
  if tpm > 0 then
    redis.call('ZADD', k .. ':t', now, id)
    redis.call('HSET', k .. ':tk', id, tokens)
    redis.call('INCRBY', k .. ':tt', tokens)
    redis.call('PEXPIRE', k .. ':t', keep)
    redis.call('PEXPIRE', k .. ':tk', keep)
    redis.call('PEXPIRE', k .. ':tt', keep)
  end
  redis.call('HSET', k .. ':cfg', 'rpm', rpm, 'tpm', tpm, 'concurrency', conc, 'window_ms', win)
  redis.call('PEXPIRE', k .. ':cfg', keep)
  redis.call('SADD', KEYS[2], k)
end
return {1, tokens, ''}
