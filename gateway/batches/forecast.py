"""When a batch must spill: the finish predicted at the dedicated backends' current rate
for this batch, against the end of its completion window less a margin. Pure: times
are passed in (seconds, one clock)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

# The rate is measured over a window this share of the completion window, within
# these bounds: long enough to smooth single lines, short enough to see a burst of
# interactive traffic take the dedicated capacity away.
RATE_WINDOW_SHARE = 0.05
RATE_WINDOW_MIN_S = 1.0
RATE_WINDOW_MAX_S = 300.0


def rate_window_s(completion_window_s: float) -> float:
    return min(RATE_WINDOW_MAX_S, max(RATE_WINDOW_MIN_S,
                                      completion_window_s * RATE_WINDOW_SHARE))


@dataclass(slots=True)
class LocalRate:
    """Lines this batch finished on dedicated capacity per second, over `window_s`."""

    window_s: float
    started_at: float  # when the batch started running (here)
    finished: deque[float] = field(default_factory=deque)

    def line_finished(self, now: float) -> None:
        self.finished.append(now)

    def per_s(self, now: float) -> float | None:
        """None until the batch has run for one window: too early to judge."""
        while self.finished and self.finished[0] < now - self.window_s:
            self.finished.popleft()
        if now - self.started_at < self.window_s:
            return None
        return len(self.finished) / self.window_s


def forecast_finish(now: float, remaining: int, rate_per_s: float | None) -> float:
    """When `remaining` lines would be done at `rate_per_s` (inf: never)."""
    if remaining <= 0:
        return now
    if rate_per_s is None or rate_per_s <= 0:
        return math.inf
    return now + remaining / rate_per_s


def should_spill(now: float, remaining: int, rate_per_s: float | None, window_end: float,
                 margin_s: float) -> bool:
    """Spill the next line: past the window's end less the margin always; before it,
    when the measured rate would finish the rest too late. Before a rate is known (the
    first window) nothing spills early."""
    latest = window_end - margin_s
    if now >= latest:
        return True
    if rate_per_s is None:
        return False
    return forecast_finish(now, remaining, rate_per_s) > latest
