-- Reconcile one reservation with its actual usage and add it to the spend ledger, once
-- (after window.lua): a settlement replayed because its reply was lost (a timeout
-- after Redis ran it) finds its receipt marked and changes nothing. Returns 1, or 0
-- for such a replay. Without scopes it only adds to the ledger (the spend of a request
-- decided locally while Redis was down).
-- KEYS: one window hash per scope, the tenant's day and month ledger hashes, then this
--       gateway's receipts for the tenant (as admit.lua).
-- ARGV: now_ms, window_ms, scope_ttl_ms, receipts_ttl_ms, receipt_slots, receipt number,
--       delta_tokens (actual - estimate), input_tokens, output_tokens, cost_micros,
--       day_ttl_ms, month_ttl_ms, refund_request (1: no backend answered, the request
--       leaves the windows too), then per scope: the start of the window that counted
--       the reservation (or its admission time, ms).
local now, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local scope_ttl, receipts_ttl, slots = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local number, delta = tonumber(ARGV[6]), tonumber(ARGV[7])
local refund_request = tonumber(ARGV[13]) == 1
local n = #KEYS - 3

local receipts = KEYS[n + 3]
local slot, tag = receipt_slot(number, slots)
if redis.call('BITFIELD', receipts, 'GET', 'u16', slot)[1] == tag + 32768 then
  return 0
end
-- marked whatever the slot held: an admission receipt, or nothing (it was decided
-- locally, or the slot went to a later reservation: then only a replay goes unnoticed)
redis.call('BITFIELD', receipts, 'SET', 'u16', slot, tag + 32768)
redis.call('PEXPIRE', receipts, receipts_ttl)

if delta ~= 0 or refund_request then
  for i = 1, n do
    local w = load_window(KEYS[i], now, window)
    if reconcile(w, tonumber(ARGV[13 + i]), delta, window, refund_request) then
      save_window(KEYS[i], w, scope_ttl)
    end
  end
end

local periods = {{KEYS[n + 1], tonumber(ARGV[11])}, {KEYS[n + 2], tonumber(ARGV[12])}}
for _, period in ipairs(periods) do
  redis.call('HINCRBY', period[1], 'requests', 1)
  redis.call('HINCRBY', period[1], 'input_tokens', ARGV[8])
  redis.call('HINCRBY', period[1], 'output_tokens', ARGV[9])
  redis.call('HINCRBY', period[1], 'spend_micros', ARGV[10])
  redis.call('PEXPIRE', period[1], period[2])
end
return 1
