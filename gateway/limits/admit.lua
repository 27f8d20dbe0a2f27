-- One admission, atomically, in one round trip (after window.lua).
-- KEYS: one window hash per scope, then the tenant's day and month ledger hashes, then
--       this gateway's receipts for the tenant. All share the {tenant} hash tag.
-- ARGV: now_ms, window_ms, scope_ttl_ms, receipts_ttl_ms, receipt_slots, receipt number,
--       tokens, budget_day, budget_month (micro-dollars, -1: none),
--       then per scope: requests_per_minute, tokens_per_minute (-1: none).
-- Returns {verdict, scope_index (0: none), spent_day, spent_month, then per scope:
--          s, r, t, pr, pt} — each scope rolled to now, counting this request if admitted
--          (the caller works out what was used, the retry and the reset from them).
local now, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local scope_ttl, receipts_ttl, slots = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local number, tokens = tonumber(ARGV[6]), tonumber(ARGV[7])
local budget_day, budget_month = tonumber(ARGV[8]), tonumber(ARGV[9])
local n = #KEYS - 3

local spent_day = tonumber(redis.call('HGET', KEYS[n + 1], 'spend_micros') or '0')
local spent_month = tonumber(redis.call('HGET', KEYS[n + 2], 'spend_micros') or '0')
if budget_day >= 0 and spent_day >= budget_day then
  return {'budget_day', 0, spent_day, spent_month}
end
if budget_month >= 0 and spent_month >= budget_month then
  return {'budget_month', 0, spent_day, spent_month}
end

local verdict, which = 'ok', 0
local windows = {}
for i = 1, n do
  local w = load_window(KEYS[i], now, window)
  windows[i] = w
  if verdict == 'ok' then
    local rpm, tpm = tonumber(ARGV[8 + 2 * i]), tonumber(ARGV[9 + 2 * i])
    if rpm >= 0 and not fits(w.pr, w.r, 1, rpm, w.e, window) then
      verdict, which = 'requests', i
    elseif tpm >= 0 and not fits(w.pt, w.t, tokens, tpm, w.e, window) then
      verdict, which = 'tokens', i
    end
  end
end

if verdict == 'ok' then
  for i = 1, n do
    local w = windows[i]
    w.r, w.t = w.r + 1, w.t + tokens
    save_window(KEYS[i], w, scope_ttl)
  end
  local slot, tag = receipt_slot(number, slots)
  redis.call('BITFIELD', KEYS[n + 3], 'SET', 'u16', slot, tag)
  redis.call('PEXPIRE', KEYS[n + 3], receipts_ttl)
end

local result = {verdict, which, spent_day, spent_month}
for i = 1, n do
  local w = windows[i]
  result[#result + 1] = w.s
  result[#result + 1] = w.r
  result[#result + 1] = w.t
  result[#result + 1] = w.pr
  result[#result + 1] = w.pt
end
return result
