"""Whether a reachable limit store is too slow to wait for (`limits.store_latency`).

Two bounds: one call past `call_timeout_s` is abandoned (the request is decided as
`on_store_error` says and the store goes out at once), and the store also goes out
when the p99 of its calls over the last `window_s` passes `p99_s`. "p99 over the
budget" is "more than 1 % of the calls took longer than the budget", so the window
keeps, per tenth of it, the calls and those over the budget: two additions a call and
a fixed size whatever the traffic, with a coarse histogram beside them for reports.
It takes `MIN_OVER` calls over the budget in the window as well, so one slow call at a
quiet hour is not an outage, while a Redis slow from the start is out after a few calls
whatever the traffic.

What the gateway's own event loop adds to a call is not Redis's slowness: a loop
busy with a burst delays every reply it reads. `LoopLag` measures that delay (how late
a timer fires) and it is taken off each call before the call is judged, so a loaded
gateway does not pass for a slow Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from bisect import bisect_left
from dataclasses import dataclass

SLICES = 10  # the window moves a tenth at a time
MIN_OVER = 3  # calls over the budget in the window before it can be out
SLOW_SHARE = 0.01  # p99: more than 1 % over the budget
# upper bounds of the report histogram, in seconds (the last bucket is unbounded)
BOUNDS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5,
            1.0, 2.0, 5.0)
LAG_SAMPLE_S = 0.1  # how often the event loop's lag is sampled


@dataclass(frozen=True, slots=True)
class LatencyBudget:
    """`limits.store_latency` in seconds."""

    p99_s: float | None  # None: no p99 judgement, only the call timeout
    window_s: float
    call_timeout_s: float


class LatencyWindow:
    """The store's calls over the last `window_s` (on the monotonic clock)."""

    def __init__(self, budget: LatencyBudget) -> None:
        self.budget = budget
        self._slice_s = budget.window_s / SLICES
        self._slice_of = [-1] * SLICES  # which slice (a count of slice lengths) each holds
        self._calls = [0] * SLICES
        self._over = [0] * SLICES
        self._histogram = [[0] * (len(BOUNDS_S) + 1) for _ in range(SLICES)]

    def observe(self, elapsed_s: float, now: float) -> bool:
        """Count one call that took `elapsed_s`; True when the window's p99 is now over
        the budget (only a call over it can make it so: then the window is summed)."""
        current = int(now // self._slice_s)
        i = current % SLICES
        if self._slice_of[i] != current:
            self._slice_of[i] = current
            self._calls[i] = self._over[i] = 0
            self._histogram[i] = [0] * (len(BOUNDS_S) + 1)
        self._calls[i] += 1
        self._histogram[i][bisect_left(BOUNDS_S, elapsed_s)] += 1
        budget = self.budget.p99_s
        if budget is None or elapsed_s <= budget:
            return False
        self._over[i] += 1
        calls, over = self.counts(now)
        return over >= MIN_OVER and over > SLOW_SHARE * calls

    def counts(self, now: float) -> tuple[int, int]:
        """(calls, calls over the budget) in the window ending at `now`."""
        live = self._live(now)
        return sum(self._calls[i] for i in live), sum(self._over[i] for i in live)

    def p99_s(self, now: float) -> float | None:
        """The p99 of the window's calls, as the histogram bound it falls under (None: no
        calls; `inf`: over the largest bound)."""
        live = self._live(now)
        total = sum(self._calls[i] for i in live)
        if not total:
            return None
        seen = 0
        for bucket, bound in enumerate((*BOUNDS_S, float("inf"))):
            seen += sum(self._histogram[i][bucket] for i in live)
            if seen >= 0.99 * total:
                return bound
        return float("inf")

    def clear(self) -> None:
        """Forget every call (a store taken back starts from an empty window)."""
        self._slice_of = [-1] * SLICES

    def _live(self, now: float) -> list[int]:
        current = int(now // self._slice_s)
        return [i for i in range(SLICES) if current - SLICES < self._slice_of[i] <= current]


class LoopLag:
    """How late the event loop runs what is due: sampled by a timer every
    `LAG_SAMPLE_S`, the larger of the last two samples (a burst's lag is seen by the
    calls it delays before the sampler's next turn)."""

    def __init__(self) -> None:
        self.lag_s = 0.0
        self._last_s = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start sampling (at most once; needs a running loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            due = time.monotonic() + LAG_SAMPLE_S
            await asyncio.sleep(LAG_SAMPLE_S)
            late = max(0.0, time.monotonic() - due)
            self.lag_s, self._last_s = max(late, self._last_s), late

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
