"""A rolling window of recent requests, summarised for the live dashboard.

Prometheus histograms cannot give a faithful p95 per backend without a query
engine, so the dashboard reads this window instead: the last `window_s` seconds
(at most `max_samples` requests — memory is bounded however busy the gateway).
In a multi-worker deployment each worker sees its own traffic only; Grafana over
the Prometheus metrics is the cluster-wide view.

The window keeps its samples as columns (one deque per field) of strings and
numbers, not as an object or a tuple per request: tens of thousands of objects that
live for minutes filled the garbage collector's young generation, whose collections
then paused the event loop for tens of milliseconds.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple


class Sample(NamedTuple):
    at_s: float  # wall-clock seconds
    backend: str
    route: str
    status: int
    total_ms: float
    queue_ms: float
    ttft_ms: float | None
    inference_ms: float | None
    reason: str | None
    cost_usd: float
    cache: str | None = None  # the response cache's answer, on a route that has one


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return round(ordered[rank - 1], 3)


class LiveWindow:
    """The last few minutes of this process's finished requests, for the dashboard."""

    def __init__(
        self,
        *,
        window_s: float = 300.0,
        max_samples: int = 20_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.window_s = window_s
        self.clock = clock
        # Sample's fields, column by column (see the module's docstring)
        self._columns: tuple[deque[Any], ...] = tuple(
            deque(maxlen=max_samples) for _ in Sample._fields)
        self._rejected_at: deque[float] = deque(maxlen=max_samples)
        self._rejected_kind: deque[str] = deque(maxlen=max_samples)

    def record(self, sample: Sample) -> None:
        for column, value in zip(self._columns, sample, strict=True):
            column.append(value)

    def rejected(self, kind: str) -> None:
        """A request refused before routing (`rate_limit`, `budget`, `shed`, …)."""
        self._rejected_at.append(self.clock())
        self._rejected_kind.append(kind)

    def _trim(self, now: float) -> None:
        horizon = now - self.window_s
        at_s = self._columns[0]
        while at_s and at_s[0] < horizon:
            for column in self._columns:
                column.popleft()
        while self._rejected_at and self._rejected_at[0] < horizon:
            self._rejected_at.popleft()
            self._rejected_kind.popleft()

    def snapshot(self, *, rate_buckets: int = 60) -> dict[str, Any]:
        """JSON-ready summary: per backend p50/p95, shares, reasons, spend, rejections."""
        now = self.clock()
        self._trim(now)
        samples = [Sample._make(row) for row in zip(*self._columns, strict=True)]
        # a request refused before routing (401, 404, a rate limit) has no backend: it
        # counts in `requests` and `status`, not as a backend named ""
        routed = [s for s in samples if s.backend]
        backends: dict[str, dict[str, Any]] = {}
        for name in sorted({s.backend for s in routed}):
            mine = [s for s in samples if s.backend == name]
            # latency of the answers only: a fast failure is not a fast request, and
            # would pull e2e below the inference time it never had
            served = [s for s in mine if s.status < 400]
            inference = [s.inference_ms for s in served if s.inference_ms is not None]
            ttft = [s.ttft_ms for s in served if s.ttft_ms is not None]
            classes = Counter(f"{s.status // 100}xx" for s in mine)
            errors = sum(1 for s in mine if s.status >= 500)
            backends[name] = {
                "requests": len(mine),
                "errors": errors,
                "error_rate": round(errors / len(mine), 4),
                "status_classes": dict(sorted(classes.items())),
                "e2e_ms": _p50_p95([s.total_ms for s in served]),
                "inference_ms": _p50_p95(inference),
                "inference_reported": len(inference),
                "queue_ms": _p50_p95([s.queue_ms for s in served]),
                "ttft_ms": _p50_p95(ttft),
                "spend_usd": round(sum(s.cost_usd for s in mine), 6),
            }
        # requests per second over the last `rate_buckets` seconds, oldest first
        rate = [0] * rate_buckets
        for s in samples:
            age = int(now - s.at_s)
            if 0 <= age < rate_buckets:
                rate[rate_buckets - 1 - age] += 1
        return {
            "now": now,
            "window_s": self.window_s,
            "requests": len(samples),
            "backends": backends,
            "rate_per_s": rate,
            "share": dict(Counter(s.backend for s in routed)),
            "reasons": dict(Counter(s.reason for s in routed if s.reason)),
            "status": {str(k): v for k, v in Counter(s.status for s in samples).items()},
            "spend_usd": round(sum(s.cost_usd for s in samples), 6),
            "rejections": dict(Counter(self._rejected_kind)),
            "cache": dict(Counter(s.cache for s in samples if s.cache)),
        }


def _p50_p95(values: list[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 50), "p95": percentile(values, 95)}
