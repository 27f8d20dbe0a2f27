"""A rolling window of recent requests, summarised for the live dashboard.

Prometheus histograms cannot give a faithful p95 per backend without a query
engine, so the dashboard reads this window instead: the last `window_s` seconds
(at most `max_samples` requests — memory is bounded however busy the gateway).
In a multi-worker deployment each worker sees its own traffic only; Grafana over
the Prometheus metrics is the cluster-wide view.

The window keeps each sample as a plain tuple of strings and numbers, which the
garbage collector stops tracking: tens of thousands of objects that live for
minutes would otherwise be walked by every full collection (pauses of ~25 ms).
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


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return round(ordered[rank - 1], 3)


class LiveStats:
    def __init__(
        self,
        *,
        window_s: float = 300.0,
        max_samples: int = 20_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.window_s = window_s
        self.clock = clock
        self._samples: deque[tuple[Any, ...]] = deque(maxlen=max_samples)
        self._rejections: deque[tuple[float, str]] = deque(maxlen=max_samples)

    def record(self, sample: Sample) -> None:
        self._samples.append(tuple(sample))  # an exact tuple: see the module's docstring

    def rejected(self, kind: str) -> None:
        """A request refused before routing (`rate_limit`, `budget`, `shed`, …)."""
        self._rejections.append((self.clock(), kind))

    def _trim(self, now: float) -> None:
        horizon = now - self.window_s
        while self._samples and self._samples[0][0] < horizon:  # at_s
            self._samples.popleft()
        while self._rejections and self._rejections[0][0] < horizon:
            self._rejections.popleft()

    def snapshot(self, *, rate_buckets: int = 60) -> dict[str, Any]:
        """JSON-ready summary: per backend p50/p95, shares, reasons, spend, rejections."""
        now = self.clock()
        self._trim(now)
        samples = [Sample._make(sample) for sample in self._samples]
        backends: dict[str, dict[str, Any]] = {}
        for name in sorted({s.backend for s in samples}):
            mine = [s for s in samples if s.backend == name]
            inference = [s.inference_ms for s in mine if s.inference_ms is not None]
            ttft = [s.ttft_ms for s in mine if s.ttft_ms is not None]
            backends[name] = {
                "requests": len(mine),
                "errors": sum(1 for s in mine if s.status >= 500),
                "e2e_ms": _p50_p95([s.total_ms for s in mine]),
                "inference_ms": _p50_p95(inference),
                "inference_reported": len(inference),
                "queue_ms": _p50_p95([s.queue_ms for s in mine]),
                "ttft_ms": _p50_p95(ttft),
                "spend_usd": round(sum(s.cost_usd for s in mine), 6),
            }
        # requests per second over the last `rate_buckets` seconds, oldest first
        rate = [0] * rate_buckets
        for s in samples:
            age = int(now - s.at_s)
            if 0 <= age < rate_buckets:
                rate[rate_buckets - 1 - age] += 1
        routed = [s for s in samples if s.backend]
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
            "rejections": dict(Counter(kind for _, kind in self._rejections)),
        }


def _p50_p95(values: list[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 50), "p95": percentile(values, 95)}
