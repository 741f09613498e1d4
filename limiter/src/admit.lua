-- The limiter's one round trip: settle the calls this worker finished since its last
-- trip, then (optionally) admit one call, atomically.
--
-- Every key carries the hash tag of KEYS[1], so a Redis Cluster keeps them in one slot;
-- the keys named in ARGV (rule prefixes, per-model counters) are derived from it.
-- KEYS[1]: learned output averages (hash, field `limit_key|model`); KEYS[2]: the index of
-- rule keys (set); KEYS[3]: holds (hash, field -> until ms); KEYS[4]: when a field last
-- announced its limits (hash); KEYS[5]: every field in use, scored by its last settlement
-- (sorted set).
-- ARGV[1]: now (ms); ARGV[2]: the prefix of the per-model counters; ARGV[3]: the most
-- fields kept; ARGV[4]: how many settlements follow; then each settlement, then the ask
-- (see below).
-- Returns {1, reserved tokens, start delay ms, tight, what the delay waits for} to go,
-- {0, wait ms, 0, 0, reason} not to.
local now = tonumber(ARGV[1])
local base = ARGV[2]
local maxfields = tonumber(ARGV[3])
local p = 4
local function str()
  local v = ARGV[p]
  p = p + 1
  return v
end
local function num()
  return tonumber(str())
end

-- The model of a field is the caller's to name, so the hashes keyed by field are kept to
-- the `maxfields` fields settled most recently: `field` is recorded as just used, and the
-- fields past the bound are forgotten everywhere they are kept. Called after the
-- settlement's writes, so that even a field evicted at once (a worker whose clock is
-- behind) leaves nothing behind.
local function touch(field)
  redis.call('ZADD', KEYS[5], now, field)
  local n = redis.call('ZCARD', KEYS[5])
  if n <= maxfields then return end
  local old = redis.call('ZPOPMIN', KEYS[5], n - maxfields)
  for i = 1, #old, 2 do
    local f = old[i]
    redis.call('HDEL', KEYS[1], f)
    redis.call('HDEL', KEYS[3], f)
    redis.call('HDEL', KEYS[4], f)
    redis.call('DEL', base .. 'left:r|' .. f, base .. 'left:t|' .. f,
      base .. 'announced|' .. f, base .. 'log:r|' .. f)
  end
end

-- A settlement: id, total tokens used (-1 unknown), output tokens (-1 unknown), the
-- field, hold until ms (0 none), whether the call never went out (1: its place in the
-- windows is given back, as if never booked), then what the answer announced: requests
-- left and their reset ms, tokens left and their reset ms, the limits of requests and
-- tokens (-1 each unknown), then the number of rule prefixes the call was reserved under
-- and those.
local function settle()
  local id, used, out, field, hold = str(), num(), num(), str(), num()
  local unsent = num() == 1
  local rl, rr, tl, tr, lr, lt = num(), num(), num(), num(), num(), num()
  local nk = num()
  for _ = 1, nk do
    local k = str()
    redis.call('ZREM', k .. ':c', id)
    if unsent then
      redis.call('ZREM', k .. ':r', id)
      local was = tonumber(redis.call('HGET', k .. ':tk', id))
      if was and redis.call('ZREM', k .. ':t', id) == 1 then
        redis.call('HDEL', k .. ':tk', id)
        redis.call('DECRBY', k .. ':tt', was)
      end
    elseif used >= 0 then
      local was = tonumber(redis.call('HGET', k .. ':tk', id))
      if was then
        redis.call('HSET', k .. ':tk', id, used)
        redis.call('INCRBY', k .. ':tt', used - was)
      end
    end
  end
  if out >= 0 and nk > 0 then
    local a = tonumber(redis.call('HGET', KEYS[1], field) or '')
    if a then a = a * 0.8 + out * 0.2 else a = out end
    redis.call('HSET', KEYS[1], field, a)
  end
  local cur = tonumber(redis.call('HGET', KEYS[3], field) or '0')
  if hold > now and hold > cur then
    redis.call('HSET', KEYS[3], field, hold)
  elseif cur > 0 and cur <= now then
    redis.call('HDEL', KEYS[3], field)
  end
  if rl >= 0 and rr > 0 then
    redis.call('SET', base .. 'left:r|' .. field, rl, 'PX', rr)
  end
  if tl >= 0 and tr > 0 then
    redis.call('SET', base .. 'left:t|' .. field, tl, 'PX', tr)
  end
  local limits = base .. 'announced|' .. field
  if lr > 0 and rr > 0 then
    local w = math.max(rr, tonumber(redis.call('HGET', limits, 'window_r') or '0'))
    redis.call('HSET', limits, 'limit_r', lr, 'window_r', math.min(w, 3600000))
  end
  if lt > 0 and tr > 0 then
    local w = math.max(tr, tonumber(redis.call('HGET', limits, 'window_t') or '0'))
    redis.call('HSET', limits, 'limit_t', lt, 'window_t', math.min(w, 3600000))
  end
  if lr > 0 or lt > 0 then
    redis.call('PEXPIRE', limits, 3600000)
  end
  if rl >= 0 or tl >= 0 then
    redis.call('HSET', KEYS[4], field, now)
  end
  touch(field)
end

-- Configured rules: id, reservation ttl ms, input tokens, max output tokens, the field,
-- the longest start delay the caller takes (ms), the number of rules, then per rule its
-- prefix, requests, tokens and concurrency per window (0 = no such limit) and window ms.
--
-- Requests and tokens are sliding-window logs, scored by when a call starts. A call the
-- windows have no room for now books the earliest start they allow, if the caller takes
-- that long: it is recorded at that start and told to wait until then, so that it never
-- asks twice. Calls in flight are scored by their expiry (a dead worker's reservation
-- leaves on its own); a full set cannot be booked ahead (a slot frees when a call
-- settles, which no score tells), so it is asked again soon.
local function rules()
  local id, ttl, input, maxout, field, maxwait = str(), num(), num(), num(), str(), num()
  local n = num()
  local out = maxout
  local avg = tonumber(redis.call('HGET', KEYS[1], field) or '')
  if avg then
    -- A learned average with headroom, never more than the request allows.
    out = math.min(maxout, math.ceil(avg * 1.5) + 16)
  end
  local tokens = input + out
  local rs = {}
  for i = 1, n do
    rs[i] = { k = str(), rpm = num(), tpm = num(), conc = num(), win = num() }
  end
  local at, why = now, ''
  local busy = 0
  local tight = 0
  for _, r in ipairs(rs) do
    local k = r.k
    if r.conc > 0 then
      redis.call('ZREMRANGEBYSCORE', k .. ':c', '-inf', now)
      local inflight = redis.call('ZCARD', k .. ':c')
      if inflight >= r.conc then
        local first = redis.call('ZRANGE', k .. ':c', 0, 0, 'WITHSCORES')
        busy = math.max(busy, math.max(1, math.min(tonumber(first[2]) - now, 50)))
      elseif (inflight + 1) * 2 > r.conc then
        -- Over half the slots taken: this call's slot is wanted back promptly.
        tight = 1
      end
    end
    if r.rpm > 0 then
      redis.call('ZREMRANGEBYSCORE', k .. ':r', '-inf', now - r.win)
      local count = redis.call('ZCARD', k .. ':r')
      if count >= r.rpm then
        -- Once this entry has left the window, rpm - 1 remain in it.
        local e = redis.call('ZRANGE', k .. ':r', count - r.rpm, count - r.rpm, 'WITHSCORES')
        local t = tonumber(e[2]) + r.win
        if t > at then at, why = t, 'rpm' end
      end
    end
    if r.tpm > 0 then
      local old = redis.call('ZRANGEBYSCORE', k .. ':t', '-inf', now - r.win)
      if #old > 0 then
        local sum = 0
        for j = 1, #old do
          sum = sum + (tonumber(redis.call('HGET', k .. ':tk', old[j])) or 0)
          redis.call('HDEL', k .. ':tk', old[j])
        end
        redis.call('DECRBY', k .. ':tt', sum)
        redis.call('ZREMRANGEBYSCORE', k .. ':t', '-inf', now - r.win)
      end
      local total = tonumber(redis.call('GET', k .. ':tt') or '0')
      -- A call larger than the whole allowance goes alone, into an empty window.
      if total > 0 and total + tokens > r.tpm then
        local need = total + tokens - r.tpm
        local entries = redis.call('ZRANGE', k .. ':t', 0, -1, 'WITHSCORES')
        local freed = 0
        local t = now + r.win
        for j = 1, #entries, 2 do
          freed = freed + (tonumber(redis.call('HGET', k .. ':tk', entries[j])) or 0)
          t = tonumber(entries[j + 1]) + r.win
          if freed >= need then break end
        end
        if t > at then at, why = t, 'tpm' end
      end
    end
  end
  local delay = math.ceil(at - now)
  if busy > 0 then
    return { 0, math.max(busy, delay), 0, 0, 'concurrency' }
  end
  if delay > maxwait then
    return { 0, math.max(1, delay), 0, 0, why }
  end
  for _, r in ipairs(rs) do
    local k = r.k
    local keep = r.win + ttl + delay
    if r.conc > 0 then
      redis.call('ZADD', k .. ':c', at + ttl, id)
      redis.call('PEXPIRE', k .. ':c', keep)
    end
    if r.rpm > 0 then
      redis.call('ZADD', k .. ':r', at, id)
      redis.call('PEXPIRE', k .. ':r', keep)
    end
    if r.tpm > 0 then
      redis.call('ZADD', k .. ':t', at, id)
      redis.call('HSET', k .. ':tk', id, tokens)
      redis.call('INCRBY', k .. ':tt', tokens)
      redis.call('PEXPIRE', k .. ':t', keep)
      redis.call('PEXPIRE', k .. ':tk', keep)
      redis.call('PEXPIRE', k .. ':tt', keep)
    end
    redis.call('HSET', k .. ':cfg', 'rpm', r.rpm, 'tpm', r.tpm, 'concurrency', r.conc,
      'window_ms', r.win)
    redis.call('PEXPIRE', k .. ':cfg', keep)
    redis.call('SADD', KEYS[2], k)
  end
  return { 1, tokens, delay, tight, why }
end

-- No rule, but the provider announces its limits: the field, the call's token estimate
-- and an id for it. What a key and model have left until their reset, as last announced, is a
-- counter that expires at the reset; an expired one starts again from the limit last
-- announced, for as long as the last announced reset (so the waiters of a window that
-- just reset do not all go). The call goes while both last, else waits for the reset.
--
-- A provider may count over a sliding window, where a counter that starts again in full at
-- its reset lets a burst in while the window still holds recent calls. So the fleet's own
-- calls on the field are logged too (the id, scored by when it went), and no more of them
-- go within the announced window (the longest reset it announced, with the arrival guard
-- of a configured rule) than the announced limit of requests.
local function learned()
  local field, tokens, id = str(), num(), str()
  local limits = base .. 'announced|' .. field
  local wait = 0
  local log = base .. 'log:r|' .. field
  local lr = tonumber(redis.call('HGET', limits, 'limit_r') or '')
  local lw = tonumber(redis.call('HGET', limits, 'window_r') or '')
  if lw then lw = lw + math.max(50, math.min(lw / 20, 250)) end
  if lr and lr > 0 and lw and lw > 0 then
    redis.call('ZREMRANGEBYSCORE', log, '-inf', now - lw)
    local n = redis.call('ZCARD', log)
    if n >= lr then
      local e = redis.call('ZRANGE', log, n - lr, n - lr, 'WITHSCORES')
      local w = math.ceil(tonumber(e[2]) + lw - now)
      if w > wait then wait = w end
    end
  end
  local function counter(key, lfield, wfield)
    local v = redis.call('GET', key)
    if v then return tonumber(v) end
    local limit = tonumber(redis.call('HGET', limits, lfield) or '')
    local window = tonumber(redis.call('HGET', limits, wfield) or '')
    if limit and window and window > 0 then
      redis.call('SET', key, limit, 'PX', window)
      return limit
    end
    return nil
  end
  local function reset_in(key)
    local t = redis.call('PTTL', key)
    if t < 0 then t = 1000 end
    if t > wait then wait = t end
  end
  local kr, kt = base .. 'left:r|' .. field, base .. 'left:t|' .. field
  local r = counter(kr, 'limit_r', 'window_r')
  if r and r <= 0 then reset_in(kr) end
  local t = counter(kt, 'limit_t', 'window_t')
  if t and t < tokens then reset_in(kt) end
  if wait > 0 then return { 0, math.max(1, wait), 0, 0, 'provider' } end
  if r then redis.call('DECR', kr) end
  if t then redis.call('DECRBY', kt, tokens) end
  if lr and lr > 0 and lw and lw > 0 then
    redis.call('ZADD', log, now, id)
    redis.call('PEXPIRE', log, math.ceil(lw))
  end
  return { 1, 0, 0, 0, '' }
end

local settlements = num()
for _ = 1, settlements do
  settle()
end
local mode = str()
if mode == 'rules' then
  return rules()
elseif mode == 'learned' then
  return learned()
end
return { 1, 0, 0, 0, '' }
