"""Whether a reachable limit store is too slow to wait for (`limits.store_latency`).

Two bounds: one call past `call_timeout_s` is abandoned (the request is decided as
`on_store_error` says and the store goes out at once), and the store also goes out when
the p99 of its calls stays over `p99_s` through `window_s` seconds in a row. "p99 over
the budget" is "more than 1 % of the calls took longer than the budget", so each second
keeps two counts (its calls, those over the budget): two additions a call, a fixed size
whatever the traffic, with a coarse histogram beside them for reports. Seconds in a row,
each with calls: a burst that slows a second or two is not an outage, nor is one slow
call at a quiet hour, while a Redis that is slow stays slow second after second.

What the gateway's own event loop adds to a call is not Redis's slowness: a loop busy
with a burst delays every reply it reads. `LoopLag` measures that delay (how late a
timer fires) and it is taken off each call before the call is judged.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from bisect import bisect_left
from dataclasses import dataclass

SLOW_SHARE = 0.01  # p99: more than 1 % of a second's calls over the budget
# upper bounds of the report histogram, in seconds (the last bucket is unbounded)
BOUNDS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5,
            1.0, 2.0, 5.0)
LAG_SAMPLE_S = 0.05  # how often the event loop's lag is sampled


@dataclass(frozen=True, slots=True)
class LatencyBudget:
    """`limits.store_latency` in seconds."""

    p99_s: float | None  # None: no p99 judgement, only the call timeout
    window_s: int  # seconds in a row the p99 must stay over the budget
    call_timeout_s: float


@dataclass(slots=True)
class _Second:
    at: int  # whole seconds on the monotonic clock
    calls: int = 0
    over: int = 0
    histogram: list[int] | None = None  # per `BOUNDS_S` bucket

    def slow(self) -> bool:
        return self.over > SLOW_SHARE * self.calls


class LatencyWindow:
    """The store's calls, second by second, on the monotonic clock."""

    def __init__(self, budget: LatencyBudget) -> None:
        self.budget = budget
        self._current = _Second(-2)
        self._previous = _Second(-3)  # the last second that had calls, for reports
        self._streak = 0  # slow seconds in a row just before the current one

    def observe(self, elapsed_s: float, now: float) -> bool:
        """Count one call that took `elapsed_s`; True when the p99 has now been over the
        budget through `window_s` seconds in a row (the current one so far included)."""
        current = self._current
        if int(now) != current.at:
            current = self._next_second(int(now))
        current.calls += 1
        if current.histogram is None:
            current.histogram = [0] * (len(BOUNDS_S) + 1)
        current.histogram[bisect_left(BOUNDS_S, elapsed_s)] += 1
        budget = self.budget.p99_s
        if budget is None or elapsed_s <= budget:
            return False
        current.over += 1
        return current.slow() and self._streak + 1 >= self.budget.window_s

    def _next_second(self, at: int) -> _Second:
        ended = self._current
        # a second without calls breaks the run, as a fast one does
        self._streak = self._streak + 1 if ended.slow() and at == ended.at + 1 else 0
        self._previous, self._current = ended, _Second(at)
        return self._current

    def recent(self, now: float) -> tuple[int, int, float | None]:
        """(calls, calls over the budget, p99) of the current second and the one before it
        (p99 as the histogram bound it falls under; None: no calls; `inf`: past the last)."""
        seconds = [s for s in (self._previous, self._current) if int(now) - 1 <= s.at]
        calls = sum(s.calls for s in seconds)
        over = sum(s.over for s in seconds)
        if not calls:
            return 0, 0, None
        seen = 0
        for bucket, bound in enumerate((*BOUNDS_S, float("inf"))):
            seen += sum(s.histogram[bucket] for s in seconds if s.histogram is not None)
            if seen >= 0.99 * calls:
                return calls, over, bound
        return calls, over, float("inf")

    def clear(self) -> None:
        """Forget every call (a store taken back starts afresh)."""
        self._current, self._previous, self._streak = _Second(-2), _Second(-3), 0


class LoopLag:
    """How late the event loop runs what is due: a timer every `LAG_SAMPLE_S`; the lag is
    the larger of its last lateness and how overdue it is now (a burst that keeps the
    loop busy is seen before the timer's turn comes)."""

    def __init__(self) -> None:
        self._last_s = 0.0
        self._due = float("inf")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start sampling (at most once; needs a running loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sample())

    def now_s(self, now: float) -> float:
        """The loop's lag at `now` (monotonic)."""
        return max(self._last_s, now - self._due)

    async def _sample(self) -> None:
        while True:
            self._due = time.monotonic() + LAG_SAMPLE_S
            await asyncio.sleep(LAG_SAMPLE_S)
            self._last_s = max(0.0, time.monotonic() - self._due)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
