-- Admit one call against what the provider last announced for its key and model: the
-- requests and tokens left until the window resets, each a counter that expires at the
-- reset. A counter that expired starts again from the limit last announced, for as long
-- as the last announced reset: the waiters of a window that just reset do not all go.
-- KEYS[1]: requests left; KEYS[2]: tokens left; KEYS[3]: the hash of announced limits
-- (limit_r, window_r, limit_t, window_t). ARGV[1]: the call's token estimate.
-- Returns 0 (go, counted) or the ms until the spent counter resets.
local tokens = tonumber(ARGV[1])
local wait = 0
local function counter(key, lfield, wfield)
  local v = redis.call('GET', key)
  if v then return tonumber(v) end
  local limit = tonumber(redis.call('HGET', KEYS[3], lfield) or '')
  local window = tonumber(redis.call('HGET', KEYS[3], wfield) or '')
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
local r = counter(KEYS[1], 'limit_r', 'window_r')
if r and r <= 0 then reset_in(KEYS[1]) end
local k = counter(KEYS[2], 'limit_t', 'window_t')
if k and k < tokens then reset_in(KEYS[2]) end
if wait > 0 then return wait end
if r then redis.call('DECR', KEYS[1]) end
if k then redis.call('DECRBY', KEYS[2], tokens) end
return 0
