-- Give back the tokens of an admitted request that will never run (its client left
-- while Redis decided, or the admission's reply was lost and the request was decided
-- elsewhere). Its entry stays: it was admitted, so it still counts as a request. The
-- ledger is untouched. Running it again changes nothing; an id Redis never admitted
-- is no change either.
-- KEYS: per scope i: KEYS[2i-1] log, KEYS[2i] tokens (as admit.lua).
-- ARGV: id.
local id = ARGV[1]
for i = 1, #KEYS / 2 do
  local log, tok = KEYS[2 * i - 1], KEYS[2 * i]
  local held = tonumber(redis.call('HGET', tok, id) or '0')
  if held ~= 0 and redis.call('ZSCORE', log, id) then
    redis.call('HSET', tok, id, 0)
    redis.call('HINCRBY', tok, '_total', -held)
  end
end
return 1
