-- Give back the tokens of an admitted request that will never run (its client left
-- while Redis decided, or the admission's reply was lost and the request was decided
-- elsewhere), after window.lua. It stays counted as a request; the ledger is untouched.
-- Only a reservation whose admission receipt is here is released, once: running it
-- again, or for a reservation Redis never admitted, changes nothing. Returns 1 or 0.
-- KEYS: one window hash per scope, then this gateway's receipts for the tenant.
-- ARGV: now_ms, window_ms, scope_ttl_ms, receipts_ttl_ms, receipt_slots, receipt number,
--       tokens, then per scope: the start of the window that counted the reservation
--       (or its admission time, ms).
local now, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local scope_ttl, receipts_ttl, slots = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local number, tokens = tonumber(ARGV[6]), tonumber(ARGV[7])
local n = #KEYS - 1

local receipts = KEYS[n + 1]
local slot, tag = receipt_slot(number, slots)
if redis.call('BITFIELD', receipts, 'GET', 'u16', slot)[1] ~= tag then
  return 0
end
redis.call('BITFIELD', receipts, 'SET', 'u16', slot, tag + 32768)
redis.call('PEXPIRE', receipts, receipts_ttl)
for i = 1, n do
  local w = load_window(KEYS[i], now, window)
  if reconcile(w, tonumber(ARGV[7 + i]), -tokens, window) then
    save_window(KEYS[i], w, scope_ttl)
  end
end
return 1
