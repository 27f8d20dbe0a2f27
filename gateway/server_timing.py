"""Per-request time bookkeeping behind the `Server-Timing` header.

All marks are `time.perf_counter()` seconds. The gateway's own time (`gw`) is the
total minus everything spent waiting on someone else: the upstream call and any
named wait (`add_wait("queue", ...)`), so `gw` stays honest as stages are added.

Metrics emitted (milliseconds):
  gw           time in the gateway itself
  upstream-fb  upstream request sent → first response byte (headers + first chunk)
  upstream     upstream request sent → response fully relayed
  total        request received → now
plus whatever `add_wait` / `add_metric` recorded (`queue`, `ttft`, `inference`, ...).
"""

from __future__ import annotations

from time import perf_counter


class ServerTiming:
    __slots__ = ("_metrics", "_waits", "start", "upstream_end", "upstream_first_byte",
                 "upstream_start")

    def __init__(self, start: float | None = None) -> None:
        self.start = perf_counter() if start is None else start
        self.upstream_start: float | None = None
        self.upstream_first_byte: float | None = None
        self.upstream_end: float | None = None
        self._waits: list[tuple[str, float]] = []  # (name, seconds) not counted as gateway time
        self._metrics: list[tuple[str, float]] = []  # (name, ms) reported as is

    def add_wait(self, name: str, seconds: float) -> None:
        """Time spent waiting outside the gateway's control (queue slot, ...)."""
        self._waits.append((name, seconds))

    def add_metric(self, name: str, ms: float) -> None:
        """A figure reported by someone else (the backend's own inference time, ...)."""
        self._metrics.append((name, ms))

    def upstream_started(self) -> None:
        # A retry on the next candidate restarts the clock: the failed attempt's time
        # counts as gateway time, which is where it was spent from the client's view.
        self.upstream_start = perf_counter()
        self.upstream_first_byte = None
        self.upstream_end = None

    def upstream_responded(self) -> None:
        self.upstream_first_byte = perf_counter()

    def upstream_finished(self) -> None:
        self.upstream_end = perf_counter()

    def upstream_s(self, now: float) -> float:
        if self.upstream_start is None:
            return 0.0
        return (self.upstream_end or now) - self.upstream_start

    def header(self) -> str:
        now = perf_counter()
        total = now - self.start
        upstream = self.upstream_s(now)
        waited = sum(seconds for _, seconds in self._waits)
        parts = [f"gw;dur={(total - upstream - waited) * 1000:.3f}"]
        parts.extend(f"{name};dur={seconds * 1000:.3f}" for name, seconds in self._waits)
        if self.upstream_start is not None:
            if self.upstream_first_byte is not None:
                first = (self.upstream_first_byte - self.upstream_start) * 1000
                parts.append(f"upstream-fb;dur={first:.3f}")
            parts.append(f"upstream;dur={upstream * 1000:.3f}")
        parts.extend(f"{name};dur={ms:.3f}" for name, ms in self._metrics)
        parts.append(f"total;dur={total * 1000:.3f}")
        return ", ".join(parts)
