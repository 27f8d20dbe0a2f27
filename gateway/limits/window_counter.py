"""The rate-limit algorithm: a sliding-window counter, O(1) state per scope.

A scope (a tenant, one API key, one route) keeps five integers, whatever its traffic:
the start of its current 60 s window, the requests and tokens counted in it, and those
counted in the window before it. At `now`, `e` ms into the current window (0 ≤ e < W),
the scope counts

    used = current + round(previous × (W − e) / W)          W = 60,000 ms

(the previous window's admissions taken as spread evenly over it, so their weight
falls linearly while the current window runs; its share is rounded to the nearest
whole, halves down). A request fits a scope when `used + need ≤ limit`, for requests
(need 1) and for tokens (need its estimate), and is admitted when it fits every scope
it touches; it is then counted in each (all or nothing). Windows follow each other
back to back; a scope whose newest window ended a whole window ago has nothing left
to weigh, and its next admission starts a new window at that moment.

What that guarantees, for a limit of L per minute:
  - from a fresh scope, a burst admits exactly L, however it spreads over the minute
    (the previous window is empty, and the current one holds at most L);
  - no window counts more than L admissions, and no instant sees more than L;
  - any interval of τ ms admits at most L + L·τ/W rounded to the nearest whole: a
    window's tail, then what the fall of its weight frees in the next. The worst case,
    2L within one minute, needs a window's L all at its very end and the next window's
    L at its end too: the bound of a token bucket holding L that refills L a minute (a
    fixed window would admit 2L within an instant);
  - under steady demand above the limit each window admits L, evenly spread: after a
    full window the k-th slot of the next opens (k − ½)·W/L into it. (Without the
    rounding the last slot would open only as the window ends, and demand that missed
    that millisecond would get L − 1 a minute.)

Token reservations are reconciled at settlement: an estimate larger than the actual
usage is refunded from the window that counted it (while that window still weighs:
the current or the previous one), and usage beyond the estimate is charged to the
current window, when it becomes known. A request no backend answered is refunded
in full: its tokens and the request itself.

Everything is integer milliseconds, and `fits` compares `2 × previous × (W − e)` with
`(2 × (limit − current − need) + 1) × W`, no division: the Lua scripts (doubles, exact
below 2^53) decide exactly as this module does for limits up to 7.5 × 10^10 a minute.
The stores never read a clock: `now` is passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.limits.store import WINDOW_S, Rejection, Reservation, Scope, ScopeState

WINDOW_MS = int(WINDOW_S * 1000)
# Bounds below are comparisons, not max()/min(): the builtins iterate over their
# arguments (~750 instructions a call), and these run several times a request.


def to_ms(now: float) -> int:
    """Epoch seconds (the stores' `now`) as the integer milliseconds windows count in."""
    return int(now * 1000)


@dataclass(slots=True)
class Window:
    """One scope's counts; the Redis store keeps the same five fields in a hash
    (`s`, `r`, `t`, `pr`, `pt`: gateway/limits/window.lua)."""

    start_ms: int = 0  # 0: fresh (any `now` is more than two windows after it)
    requests: int = 0
    tokens: int = 0
    previous_requests: int = 0
    previous_tokens: int = 0

    def roll(self, now_ms: int) -> int:
        """Move to the window holding `now_ms`; how far into it `now_ms` is (ms). A
        `now_ms` before the window's start (a replica whose clock is behind the one
        that began it) counts as its start."""
        elapsed = now_ms - self.start_ms
        if elapsed >= 2 * WINDOW_MS:
            self.start_ms, self.requests, self.tokens = now_ms, 0, 0
            self.previous_requests = self.previous_tokens = 0
            return 0
        if elapsed >= WINDOW_MS:
            self.start_ms += WINDOW_MS
            self.previous_requests, self.previous_tokens = self.requests, self.tokens
            self.requests = self.tokens = 0
            return elapsed - WINDOW_MS
        return elapsed if elapsed > 0 else 0

    def count(self, tokens: int) -> None:
        """An admitted request and its token estimate."""
        self.requests += 1
        self.tokens += tokens

    def reconcile(self, counted_in_ms: int, delta: int, refund_request: bool = False) -> bool:
        """A settled reservation's `actual − estimate` tokens, after `roll`:
        extra usage is charged now; a refund (of tokens, and of the request itself with
        `refund_request`) comes off the window that counted the reservation (it began
        at `counted_in_ms`, or holds it), if it still weighs. Whether anything changed."""
        current = counted_in_ms >= self.start_ms
        previous = not current and counted_in_ms >= self.start_ms - WINDOW_MS
        changed = False
        if delta > 0:
            self.tokens += delta
            changed = True
        elif delta < 0 and current:
            tokens = self.tokens + delta
            self.tokens = tokens if tokens > 0 else 0
            changed = True
        elif delta < 0 and previous:
            tokens = self.previous_tokens + delta
            self.previous_tokens = tokens if tokens > 0 else 0
            changed = True
        if refund_request and current:
            self.requests = self.requests - 1 if self.requests > 0 else 0
            changed = True
        elif refund_request and previous:
            self.previous_requests = (self.previous_requests - 1 if self.previous_requests > 0
                                      else 0)
            changed = True
        return changed


def counted_in_ms(reservation: Reservation) -> tuple[int, ...]:
    """Per scope, where `Window.reconcile` finds the window that counted a reservation."""
    if reservation.windows_ms is not None:
        return reservation.windows_ms
    return (to_ms(reservation.admitted_at),) * len(reservation.scopes)


def fits(previous: int, current: int, need: int, limit: int, elapsed_ms: int) -> bool:
    """`used + need ≤ limit`, in integers (window.lua's `fits` is the same expression)."""
    return (2 * previous * (WINDOW_MS - elapsed_ms)
            <= (2 * (limit - current - need) + 1) * WINDOW_MS)


def used(previous: int, current: int, elapsed_ms: int) -> int:
    """What the scope counts now: `limit − used` more would fit."""
    return current - (WINDOW_MS - 2 * previous * (WINDOW_MS - elapsed_ms)) // (2 * WINDOW_MS)


def _share_at_most(counted: int, most: int) -> int:
    """The first ms of a window from which what the window before counted (`counted`)
    weighs at most `most` (W: not within the window)."""
    first_ms = WINDOW_MS - (2 * most + 1) * WINDOW_MS // (2 * counted)
    return first_ms if first_ms > 0 else 0


def wait_ms(previous: int, current: int, elapsed_ms: int, most: int, counted: int) -> int:
    """Milliseconds until the scope counts at most `most` (≥ 0) if nothing more is
    counted; `counted` is what it counts now (`used`, which every caller has at hand):
    the previous window's weight falls until the current one ends, then the current
    window's does in the next."""
    if counted <= most:
        return 0
    if current <= most:  # here previous > 0: within this window, or as it ends
        return _share_at_most(previous, most - current) - elapsed_ms
    # once the next window has let enough of this one's weight fall (or the one after)
    return WINDOW_MS - elapsed_ms + _share_at_most(current, most)


def retry_after_s(previous: int, current: int, elapsed_ms: int, need: int, limit: int,
                  counted: int) -> float | None:
    """When `need` more would fit (None: never, it is more than the limit)."""
    if need > limit:
        return None
    return wait_ms(previous, current, elapsed_ms, limit - need, counted) / 1000


def reset_s(previous: int, current: int, elapsed_ms: int, limit: int, counted: int) -> float:
    """When capacity next returns: one more than is remaining now would fit (0 when
    nothing is counted)."""
    if counted > limit:
        counted = limit
    if counted <= 0:
        return 0.0
    return wait_ms(previous, current, elapsed_ms, counted - 1, counted) / 1000


def refusal(scope: Scope, window: Window, elapsed_ms: int, tokens: int) -> Rejection | None:
    """Why a request of `tokens` does not fit this scope now (None: it fits)."""
    w = window
    rpm, tpm = scope.requests_per_minute, scope.tokens_per_minute
    if rpm is not None and not fits(w.previous_requests, w.requests, 1, rpm, elapsed_ms):
        return rejection_of("requests", scope, window, elapsed_ms, tokens)
    if tpm is not None and not fits(w.previous_tokens, w.tokens, tokens, tpm, elapsed_ms):
        return rejection_of("tokens", scope, window, elapsed_ms, tokens)
    return None


def rejection_of(kind: Literal["requests", "tokens"], scope: Scope, window: Window,
                 elapsed_ms: int, tokens: int) -> Rejection:
    """The refusal of a request of `tokens` by this scope's `kind` limit: what it has
    used, and when the request would fit."""
    w = window
    if kind == "requests":
        limit, need = scope.requests_per_minute, 1
        previous, current = w.previous_requests, w.requests
    else:
        limit, need = scope.tokens_per_minute, tokens
        previous, current = w.previous_tokens, w.tokens
    assert limit is not None  # only a scope with that limit refuses by it
    counted = used(previous, current, elapsed_ms)
    return Rejection(kind, scope, limit, counted, need,
                     retry_after_s(previous, current, elapsed_ms, need, limit, counted))


def scope_state(scope: Scope, window: Window, elapsed_ms: int) -> ScopeState:
    """What the headers report for one scope (a snapshot: the window changes on)."""
    w = window
    return ScopeState(scope, used(w.previous_requests, w.requests, elapsed_ms),
                      used(w.previous_tokens, w.tokens, elapsed_ms), elapsed_ms,
                      w.previous_requests, w.requests, w.previous_tokens, w.tokens)


def requests_reset_s(state: ScopeState) -> float:
    """When one more request than remains now would fit in this scope."""
    assert state.scope.requests_per_minute is not None
    return reset_s(state.previous_requests, state.current_requests, state.elapsed_ms,
                   state.scope.requests_per_minute, state.requests)


def tokens_reset_s(state: ScopeState) -> float:
    """When one more token than remains now would fit in this scope."""
    assert state.scope.tokens_per_minute is not None
    return reset_s(state.previous_tokens, state.current_tokens, state.elapsed_ms,
                   state.scope.tokens_per_minute, state.tokens)
