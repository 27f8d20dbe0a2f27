-- Reconcile one reservation with its actual usage and add it to the spend ledger,
-- once: a settlement replayed because its reply was lost (a timeout after Redis ran
-- it) finds its id among the settled ones and changes nothing. Returns 1, or 0 for
-- such a replay.
-- KEYS: as admit.lua (scope log/tokens pairs, then day and month ledger hashes), then
--       the tenant's settled ids (zset: id -> settled at, ms).
-- ARGV: now_ms, window_ms, id, delta_tokens, input_tokens, output_tokens, cost_micros,
--       scope_ttl_ms, day_ttl_ms, month_ttl_ms, settled_ttl_ms.
local now = tonumber(ARGV[1])
local cutoff = now - tonumber(ARGV[2])
local id = ARGV[3]
local delta = tonumber(ARGV[4])
local n = (#KEYS - 3) / 2
local scope_ttl = tonumber(ARGV[8])

local settled, settled_ttl = KEYS[2 * n + 3], tonumber(ARGV[11])
if redis.call('ZADD', settled, 'NX', now, id) == 0 then
  return 0
end
redis.call('ZREMRANGEBYSCORE', settled, '-inf', now - settled_ttl)
redis.call('PEXPIRE', settled, settled_ttl)

for i = 1, n do
  local log, tok = KEYS[2 * i - 1], KEYS[2 * i]
  local score = redis.call('ZSCORE', log, id)
  if score and tonumber(score) > cutoff then
    if delta ~= 0 then
      redis.call('HINCRBY', tok, id, delta)
      redis.call('HINCRBY', tok, '_total', delta)
    end
  elseif delta > 0 then
    -- the entry aged out before the usage was known: charge the extra now, as tokens
    -- only ("_late" keeps it out of the request count; see admit.lua)
    local late = id .. ':late'
    if redis.call('ZADD', log, now, late) == 1 then
      redis.call('HINCRBY', tok, '_late', 1)
    end
    redis.call('HINCRBY', tok, late, delta)
    redis.call('HINCRBY', tok, '_total', delta)
    redis.call('PEXPIRE', log, scope_ttl)
    redis.call('PEXPIRE', tok, scope_ttl)
  end
end

local periods = {{KEYS[2 * n + 1], tonumber(ARGV[9])}, {KEYS[2 * n + 2], tonumber(ARGV[10])}}
for _, period in ipairs(periods) do
  redis.call('HINCRBY', period[1], 'requests', 1)
  redis.call('HINCRBY', period[1], 'input_tokens', ARGV[5])
  redis.call('HINCRBY', period[1], 'output_tokens', ARGV[6])
  redis.call('HINCRBY', period[1], 'spend_micros', ARGV[7])
  redis.call('PEXPIRE', period[1], period[2])
end
return 1
