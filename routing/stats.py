"""Live statistics per target ("backend/model"), fed by the gateway, read by `decide`.

`LiveStats` is the one mutable object of this package: the gateway owns one per
process and calls it from the event loop only (no locks). Each call to
`snapshot()` returns an immutable `StatsSnapshot` that `decide` reads; target
snapshots are rebuilt only when that target changed, so taking a snapshot per
request costs a dictionary copy.

Times are milliseconds, rates tokens per second, `now` is seconds on whatever
monotonic clock the caller uses (the gateway passes `loop.time()`).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

EWMA_ALPHA = 0.2  # weight of the newest sample: ~10 samples of memory
ERROR_ALPHA = 0.3  # weight of the newest outcome in `error_rate` (shown, never routed on)
WINDOW_SAMPLES = 128  # for the windowed p50/p90
OUTPUT_MEAN_HORIZON = 200  # the route's output mean is cumulative up to this many samples
LOAD_FRESH_S = 15.0  # backend-reported load older than this is ignored


# Made per request: not frozen (a frozen dataclass costs ~3x to build); read-only
# by convention.
@dataclass(slots=True)
class TargetSnapshot:
    samples: int = 0
    network_ms: float | None = None  # EWMA of connect + response-header round trip
    ttft_ms: float | None = None  # EWMA of time to first token, as measured
    ttft_p50_ms: float | None = None
    ttft_p90_ms: float | None = None
    overhead_ms: float | None = None  # EWMA of the TTFT not explained by network/queue/prefill
    decode_tokens_per_s: float | None = None  # EWMA, per stream
    service_ms: float | None = None  # EWMA of a request's whole time on the backend
    error_rate: float = 0.0  # EWMA of 0/1 outcomes: for people; routing never reads it
    last_error_at: float | None = None
    # down by its active health checks (`routing.outliers.Ejections.check_failed`)
    unhealthy_until: float | None = None
    retry_after_until: float | None = None  # the backend's own `Retry-After` on a 429/503
    in_flight: int = 0  # requests the gateway has sent and not finished
    queue_depth: int = 0  # requests waiting in the gateway's queue for this target
    backend_waiting: int | None = None  # the backend's own /metrics, when it has them
    backend_running: int | None = None
    kv_cache_use: float | None = None  # 0..1
    load_at: float | None = None  # when the backend's load was read
    abs_ttft_error_ms: float | None = None  # EWMA of |actual - predicted| TTFT

    def healthy(self, now: float) -> bool:
        """False only while its active health checks have it down: failures of requests
        eject it instead (`routing.outliers`, bounded by `max_ejection_percent`)."""
        return self.unhealthy_until is None or now >= self.unhealthy_until

    def back_at(self) -> float | None:
        """When routing will try this unhealthy target again, and not before the backend
        asked to be left alone (its `Retry-After`); None when nothing holds it back."""
        times = [t for t in (self.unhealthy_until, self.retry_after_until) if t is not None]
        return max(times) if times else None

    def load_is_fresh(self, now: float) -> bool:
        return self.load_at is not None and now - self.load_at <= LOAD_FRESH_S


EMPTY_TARGET = TargetSnapshot()


@dataclass(slots=True)
class StatsSnapshot:
    targets: Mapping[str, TargetSnapshot] = field(default_factory=lambda: MappingProxyType({}))
    output_tokens_mean: Mapping[str, float] = field(
        default_factory=lambda: MappingProxyType({}))
    # target → ejected until (`routing.outliers`); empty while every target is in service
    ejected: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def target(self, key: str) -> TargetSnapshot:
        return self.targets.get(key, EMPTY_TARGET)


@dataclass(slots=True)
class PredictionError:
    """actual − predicted, in ms (positive: slower than predicted); for the metric."""

    ttft_ms: float | None
    total_ms: float | None


def _ewma(old: float | None, sample: float, alpha: float = EWMA_ALPHA) -> float:
    return sample if old is None else old + alpha * (sample - old)


def _percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


_FIELDS = tuple(TargetSnapshot.__dataclass_fields__)
_EMPTY_VALUES = {name: getattr(EMPTY_TARGET, name) for name in _FIELDS}


class _TargetStats:
    """The mutable twin of `TargetSnapshot`: its fields in a dict, frozen into a
    snapshot only when read after a change (a request changes a target three times and
    reads it once; `dataclasses.replace` per change cost ~15 µs a request)."""

    __slots__ = ("_frozen", "_ttft_ordered", "ttft_window", "values")

    def __init__(self) -> None:
        self.values: dict[str, Any] = dict(_EMPTY_VALUES)
        self._frozen: TargetSnapshot | None = EMPTY_TARGET
        self.ttft_window: deque[float] = deque(maxlen=WINDOW_SAMPLES)  # in arrival order
        self._ttft_ordered: list[float] = []  # the same samples, sorted

    def add_ttft(self, ttft_ms: float) -> list[float]:
        """One more TTFT in the window (the oldest leaves a full one); the window sorted.
        Kept sorted as it changes: sorting 128 samples on each request cost ~2 % of a
        streamed request's instructions."""
        window, ordered = self.ttft_window, self._ttft_ordered
        if len(window) == window.maxlen:
            del ordered[bisect_left(ordered, window[0])]
        window.append(ttft_ms)
        insort(ordered, ttft_ms)
        return ordered

    def changed(self) -> dict[str, Any]:
        self._frozen = None
        return self.values

    def snapshot(self) -> TargetSnapshot:
        frozen = self._frozen
        if frozen is None:
            frozen = self._frozen = TargetSnapshot(**self.values)
        return frozen


class LiveStats:
    def __init__(self) -> None:
        self._targets: dict[str, _TargetStats] = {}
        self._output_mean: dict[str, tuple[float, int]] = {}
        self._ejected: dict[str, float] = {}
        self._snapshot: StatsSnapshot | None = None

    def _update(self, key: str) -> tuple[dict[str, Any], _TargetStats]:
        """(the target's values, to read and write in place; its record)."""
        stats = self._targets.get(key)
        if stats is None:
            stats = self._targets[key] = _TargetStats()
        self._snapshot = None
        return stats.changed(), stats

    # -- fed by the gateway around each upstream call -------------------------

    def request_queued(self, key: str) -> None:
        """An attempt waits in the gateway's queue for `key` (its slot not yet given)."""
        values, _ = self._update(key)
        values["queue_depth"] = values["queue_depth"] + 1

    def request_left_queue(self, key: str) -> None:
        """A queued attempt gave up (refused, cancelled, its deadline passed)."""
        values, _ = self._update(key)
        values["queue_depth"] = max(0, values["queue_depth"] - 1)

    def request_started(self, key: str, *, queued: bool = False) -> None:
        """An attempt got its slot and is sent; `queued`: it had waited (`request_queued`)."""
        values, _ = self._update(key)
        values["in_flight"] = values["in_flight"] + 1
        if queued and values["queue_depth"] > 0:
            values["queue_depth"] = values["queue_depth"] - 1

    def request_finished(self, key: str) -> None:
        values, _ = self._update(key)
        if values["in_flight"] > 0:
            values["in_flight"] = values["in_flight"] - 1

    def set_backend_load(self, key: str, now: float, *, waiting: int | None,
                         running: int | None, kv_cache_use: float | None = None) -> None:
        """The backend's own view of its load (local_backend / vLLM `/metrics`)."""
        self._update(key)[0].update(backend_waiting=waiting, backend_running=running,
                                    kv_cache_use=kv_cache_use, load_at=now)

    def mark_unhealthy(self, key: str, until: float | None) -> None:
        self._update(key)[0]["unhealthy_until"] = until

    def eject(self, key: str, until: float) -> None:
        """Out of service until `until` (`routing.outliers.Ejections` decides)."""
        self._ejected[key] = until
        self._snapshot = None

    def forget(self, key: str) -> None:
        """`key` is gone for good (a replica that left its fleet)."""
        self._targets.pop(key, None)
        self._ejected.pop(key, None)
        self._snapshot = None

    def restore(self, key: str) -> None:
        if self._ejected.pop(key, None) is not None:
            self._snapshot = None

    def record_error(self, key: str, now: float, *, retry_after_s: float | None = None,
                     ) -> None:
        """A connect error, timeout or 5xx from the target; `retry_after_s`: how long it
        asked to be left alone (its `Retry-After`)."""
        values, _ = self._update(key)
        values.update(samples=values["samples"] + 1, last_error_at=now,
                      error_rate=_ewma(values["error_rate"], 1.0, ERROR_ALPHA))
        if retry_after_s is not None:
            values["retry_after_until"] = now + retry_after_s

    def record_busy(self, key: str, now: float, *, retry_after_s: float | None) -> None:
        """A 429 from the target: an answer (it is up, not broken), so no error; its
        `Retry-After` is waited out in the predicted queue time (`routing.predict`)."""
        values, _ = self._update(key)
        values["retry_after_until"] = None if retry_after_s is None else now + retry_after_s

    def record_success(self, key: str, *, network_ms: float | None, ttft_ms: float | None,
                       total_ms: float | None, output_tokens: int,
                       explained_ttft_ms: float | None = None,
                       predicted_ttft_ms: float | None = None,
                       predicted_total_ms: float | None = None) -> PredictionError:
        """A finished request. `explained_ttft_ms` is the part of the predicted TTFT
        that network, queue wait and prefill account for; the rest of the measured
        TTFT is learnt as the target's fixed overhead."""
        current, stats = self._update(key)
        current["samples"] += 1
        current["error_rate"] = _ewma(current["error_rate"], 0.0, ERROR_ALPHA)
        if network_ms is not None:
            current["network_ms"] = _ewma(current["network_ms"], network_ms)
        if ttft_ms is not None:
            current["ttft_ms"] = _ewma(current["ttft_ms"], ttft_ms)
            ordered = stats.add_ttft(ttft_ms)
            current["ttft_p50_ms"] = _percentile(ordered, 0.5)
            current["ttft_p90_ms"] = _percentile(ordered, 0.9)
            if explained_ttft_ms is not None:
                overhead = max(0.0, ttft_ms - explained_ttft_ms)
                current["overhead_ms"] = _ewma(current["overhead_ms"], overhead)
            if predicted_ttft_ms is not None:
                current["abs_ttft_error_ms"] = _ewma(
                    current["abs_ttft_error_ms"], abs(ttft_ms - predicted_ttft_ms))
        if total_ms is not None:
            current["service_ms"] = _ewma(current["service_ms"], total_ms)
            if ttft_ms is not None and output_tokens > 1 and total_ms > ttft_ms:
                rate = (output_tokens - 1) * 1000.0 / (total_ms - ttft_ms)
                current["decode_tokens_per_s"] = _ewma(current["decode_tokens_per_s"], rate)
        return PredictionError(
            ttft_ms=None if ttft_ms is None or predicted_ttft_ms is None
            else ttft_ms - predicted_ttft_ms,
            total_ms=None if total_ms is None or predicted_total_ms is None
            else total_ms - predicted_total_ms,
        )

    def record_output_tokens(self, route: str, tokens: int) -> None:
        """Completion length of a finished request: the route's running mean."""
        mean, count = self._output_mean.get(route, (0.0, 0))
        count = count + 1 if count < OUTPUT_MEAN_HORIZON else OUTPUT_MEAN_HORIZON
        self._output_mean[route] = (mean + (tokens - mean) / count, count)
        self._snapshot = None

    # -- read by decide ----------------------------------------------------------

    def snapshot(self) -> StatsSnapshot:
        if self._snapshot is None:
            self._snapshot = StatsSnapshot(
                targets=MappingProxyType(
                    {key: stats.snapshot() for key, stats in self._targets.items()}),
                output_tokens_mean=MappingProxyType(
                    {route: mean for route, (mean, _) in self._output_mean.items()}),
                ejected=MappingProxyType(dict(self._ejected)),
            )
        return self._snapshot
