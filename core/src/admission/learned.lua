-- Admit one call against what the provider last announced for its key and model: the
-- requests and tokens left until the window resets, each a counter that expires at the
-- reset.
-- KEYS[1]: requests left; KEYS[2]: tokens left. ARGV[1]: the call's token estimate.
-- Returns 0 (go, counted) or the ms until the spent counter resets.
local tokens = tonumber(ARGV[1])
local wait = 0
local function reset_in(key)
  local t = redis.call('PTTL', key)
  if t < 0 then t = 1000 end
  if t > wait then wait = t end
end
local r = redis.call('GET', KEYS[1])
if r and tonumber(r) <= 0 then reset_in(KEYS[1]) end
local k = redis.call('GET', KEYS[2])
if k and tonumber(k) < tokens then reset_in(KEYS[2]) end
if wait > 0 then return wait end
if r then redis.call('DECR', KEYS[1]) end
if k then redis.call('DECRBY', KEYS[2], tokens) end
return 0
