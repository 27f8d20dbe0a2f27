-- The sliding-window counter of one scope, shared by admit.lua, settle.lua and
-- release.lua (the store prepends this file to each): the same algorithm, the same
-- integer arithmetic, as gateway/limits/window_counter.py, which explains it.
-- A scope is one hash: s (window start, ms; absent: fresh), r and t (requests and
-- tokens counted in that window), pr and pt (those of the window before it).
-- Receipts (one hash-tagged string per tenant and gateway process) are 16-bit slots:
-- reservation number n lives in slot n % slots as tag (n / slots) % 32767 + 1, plus
-- 32768 once settled or released, so a replayed settlement or release finds its mark.

-- The window holding `now`, and how far into it `now` is (`e`, ms).
local function load_window(key, now, window)
  local v = redis.call('HMGET', key, 's', 'r', 't', 'pr', 'pt')
  local w = {s = tonumber(v[1] or '0'), r = tonumber(v[2] or '0'), t = tonumber(v[3] or '0'),
             pr = tonumber(v[4] or '0'), pt = tonumber(v[5] or '0')}
  local e = now - w.s
  if e >= 2 * window then
    w.s, w.r, w.t, w.pr, w.pt, e = now, 0, 0, 0, 0, 0
  elseif e >= window then
    w.s, w.pr, w.pt, w.r, w.t, e = w.s + window, w.r, w.t, 0, 0, e - window
  elseif e < 0 then
    e = 0  -- a clock behind the one that began this window
  end
  w.e = e
  return w
end

local function save_window(key, w, ttl)
  redis.call('HSET', key, 's', w.s, 'r', w.r, 't', w.t, 'pr', w.pr, 'pt', w.pt)
  redis.call('PEXPIRE', key, ttl)
end

-- current + round(previous * (window - e) / window) + need <= limit (halves rounded
-- down), without a division
local function fits(previous, current, need, limit, e, window)
  return 2 * previous * (window - e) <= (2 * (limit - current - need) + 1) * window
end

-- A settled reservation's actual - estimate tokens: extra usage is charged now, a
-- refund (of tokens, and of the request itself with `refund_request`) comes off the
-- window that counted it (starting at or holding `at`) while that window still
-- weighs. Whether anything changed.
local function reconcile(w, at, delta, window, refund_request)
  local current = at >= w.s
  local previous = not current and at >= w.s - window
  local changed = false
  if delta > 0 then
    w.t, changed = w.t + delta, true
  elseif delta < 0 and current then
    w.t, changed = math.max(0, w.t + delta), true
  elseif delta < 0 and previous then
    w.pt, changed = math.max(0, w.pt + delta), true
  end
  if refund_request and current then
    w.r, changed = math.max(0, w.r - 1), true
  elseif refund_request and previous then
    w.pr, changed = math.max(0, w.pr - 1), true
  end
  return changed
end

local function receipt_slot(number, slots)
  return '#' .. (number % slots), math.floor(number / slots) % 32767 + 1
end
