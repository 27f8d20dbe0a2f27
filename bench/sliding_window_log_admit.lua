-- Sliding-window admission for one request, atomically, in one round trip.
-- KEYS: per scope i: KEYS[2i-1] log (zset: reservation id -> admitted at, ms),
--                    KEYS[2i]   tokens (hash: reservation id -> tokens, "_total");
--       then the tenant's day and month ledger hashes. All share the {tenant} hash tag.
--       A log member "<id>:late" is tokens charged after its request's own entry left
--       (settle.lua): no request, so "_late" in the tokens hash counts them out of RPM.
-- ARGV: now_ms, window_ms, id, tokens, budget_day, budget_month (micro-dollars, -1: none),
--       then per scope: requests_per_minute, tokens_per_minute (-1: none), ttl_ms.
-- Returns {verdict, scope_index, limit, used, requested, retry_ms (-1: never fits),
--          spent_day, spent_month, then per scope: requests, tokens, oldest_ms (-1: empty)}.
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local id = ARGV[3]
local tokens = tonumber(ARGV[4])
local budget_day = tonumber(ARGV[5])
local budget_month = tonumber(ARGV[6])
local n = (#KEYS - 2) / 2
local ttl = tonumber(ARGV[7 + 2 * n])
local cutoff = now - window
local CHUNK = 500  -- stays far below Lua's unpack() stack limit

local spent_day = tonumber(redis.call('HGET', KEYS[2 * n + 1], 'spend_micros') or '0')
local spent_month = tonumber(redis.call('HGET', KEYS[2 * n + 2], 'spend_micros') or '0')
if budget_day >= 0 and spent_day >= budget_day then
  return {'budget_day', 0, budget_day, spent_day, 0, -1, spent_day, spent_month}
end
if budget_month >= 0 and spent_month >= budget_month then
  return {'budget_month', 0, budget_month, spent_month, 0, -1, spent_day, spent_month}
end

local function is_late(member)
  return string.sub(member, -5) == ':late'
end

-- Seconds until the oldest request (not a late charge) leaves the window.
local function requests_retry(log)
  local start = 0
  while true do
    local page = redis.call('ZRANGE', log, start, start + CHUNK - 1, 'WITHSCORES')
    if #page == 0 then return window end
    for j = 1, #page, 2 do
      if not is_late(page[j]) then
        return math.max(0, tonumber(page[j + 1]) + window - now)
      end
    end
    start = start + CHUNK
  end
end

-- Seconds until enough of the oldest entries leave for `excess` tokens to be freed.
local function tokens_retry(log, tok, excess)
  local start = 0
  while true do
    local page = redis.call('ZRANGE', log, start, start + CHUNK - 1, 'WITHSCORES')
    if #page == 0 then return window end
    local ids = {}
    for j = 1, #page, 2 do ids[#ids + 1] = page[j] end
    local amounts = redis.call('HMGET', tok, unpack(ids))
    for j = 1, #ids do
      excess = excess - (tonumber(amounts[j]) or 0)
      if excess <= 0 then
        return math.max(0, tonumber(page[2 * j]) + window - now)
      end
    end
    start = start + CHUNK
  end
end

local verdict, which, limit, used, requested, retry = 'ok', 0, 0, 0, 0, 0
local counts, totals = {}, {}
for i = 1, n do
  local log, tok = KEYS[2 * i - 1], KEYS[2 * i]
  local expired = redis.call('ZRANGEBYSCORE', log, '-inf', cutoff)
  if #expired > 0 then
    local freed, late_freed = 0, 0
    for j = 1, #expired, CHUNK do
      local chunk = {unpack(expired, j, math.min(j + CHUNK - 1, #expired))}
      local amounts = redis.call('HMGET', tok, unpack(chunk))
      for k = 1, #chunk do
        freed = freed + (tonumber(amounts[k]) or 0)
        if is_late(chunk[k]) then late_freed = late_freed + 1 end
      end
      redis.call('HDEL', tok, unpack(chunk))
    end
    redis.call('HINCRBY', tok, '_total', -freed)
    if late_freed > 0 then redis.call('HINCRBY', tok, '_late', -late_freed) end
    redis.call('ZREMRANGEBYSCORE', log, '-inf', cutoff)
  end
  local count = redis.call('ZCARD', log) - tonumber(redis.call('HGET', tok, '_late') or '0')
  local total = tonumber(redis.call('HGET', tok, '_total') or '0')
  counts[i], totals[i] = count, total
  if verdict == 'ok' then
    local rpm, tpm = tonumber(ARGV[5 + 2 * i]), tonumber(ARGV[6 + 2 * i])
    if rpm >= 0 and count + 1 > rpm then
      verdict, which, limit, used, requested = 'requests', i, rpm, count, 1
      retry = requests_retry(log)
    elseif tpm >= 0 and total + tokens > tpm then
      verdict, which, limit, used, requested = 'tokens', i, tpm, total, tokens
      if tokens > tpm then retry = -1 else retry = tokens_retry(log, tok, total + tokens - tpm) end
    end
  end
end

if verdict == 'ok' then
  for i = 1, n do
    local log, tok = KEYS[2 * i - 1], KEYS[2 * i]
    redis.call('ZADD', log, now, id)
    redis.call('HSET', tok, id, tokens)
    redis.call('HINCRBY', tok, '_total', tokens)
    redis.call('PEXPIRE', log, ttl)
    redis.call('PEXPIRE', tok, ttl)
    counts[i], totals[i] = counts[i] + 1, totals[i] + tokens
  end
end

local result = {verdict, which, limit, used, requested, retry, spent_day, spent_month}
for i = 1, n do
  local first = redis.call('ZRANGE', KEYS[2 * i - 1], 0, 0, 'WITHSCORES')
  result[#result + 1] = counts[i]
  result[#result + 1] = totals[i]
  result[#result + 1] = first[2] and tonumber(first[2]) or -1
end
return result
