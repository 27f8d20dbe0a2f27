"""The queue's only source of time: injected, so tests drive it by hand."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Seconds on a monotonic scale, and a way to run a callback at one of them."""

    def now(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle: ...


class MonotonicClock:
    """`time.monotonic()` (what the pipeline stamps requests with) + the running loop's timers.

    The loop's own `time()` is not used as the scale because uvloop's is cached
    at millisecond resolution and may not share `time.monotonic()`'s origin;
    timers are converted to a delay from now instead.
    """

    def now(self) -> float:
        return time.monotonic()

    def call_at(self, when: float, callback: Callable[[], None]) -> TimerHandle:
        delay = max(0.0, when - time.monotonic())
        return asyncio.get_running_loop().call_later(delay, callback)
