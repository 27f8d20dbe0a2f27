"""Metric series as plain numbers, turned into Prometheus families only on scrape.

`prometheus_client`'s own metric objects take a lock on every update, and a histogram
walks its bucket list in Python to find the bucket: ~1–3 µs per update, a dozen updates
per proxied request. Here an update is a float add (counter, gauge) or a `bisect` and
two adds (histogram); the cumulative bucket counts, `_count`, `_sum` and `_created` are
built when `/metrics` is read.

No locks, on purpose: every update and every scrape runs on the event loop's thread
(a gateway replica is one process with one loop; `GET /metrics` renders on the loop).
An update from another thread could lose an increment, never corrupt the exposition.

The families are `Collector`s registered in a `CollectorRegistry`, so they render side
by side with collectors that other parts of the gateway register there, with the same
names, samples and label order `prometheus_client`'s `Counter`/`Gauge`/`Histogram` give.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString


class HistogramSeries:
    """One labelled histogram: per-bucket counts (not cumulative) and the sum."""

    __slots__ = ("bounds", "counts", "created", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds  # upper bounds, ascending, without +Inf
        # counts[i]: observations in (bounds[i-1], bounds[i]]; the last slot is +Inf's own
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound lands in that bound's bucket (`le`).
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class CounterSeries:
    """One labelled counter: a float that only goes up."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:  # a counter going down reads as a process restart to Prometheus
            raise ValueError(f"counters only go up (got {amount})")
        self.value += amount


class GaugeSeries:
    """One labelled gauge: a number that goes up and down."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = value


S = TypeVar("S", HistogramSeries, CounterSeries, GaugeSeries)


class _Family(Collector, Generic[S]):
    """A metric name, its help text and label names, and its series by label values."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry | None, new: Callable[[], S]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.series: dict[tuple[str, ...], S] = {}
        self._new: Callable[[], S] = new
        if not self.labelnames:  # unlabelled: the one series exists (and shows) from the start
            self.series[()] = new()
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> S:
        """The series of these label values (made on first use; callers bound the values)."""
        series = self.series.get(values)
        if series is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}, got {values}")
            series = self.series[values] = self._new()
        return series

    def _labels_of(self, values: tuple[str, ...]) -> dict[str, str]:
        return dict(zip(self.labelnames, values, strict=True))

    def describe(self) -> Iterable[Metric]:
        return [self._empty()]

    def _empty(self) -> Metric:
        raise NotImplementedError


class HistogramFamily(_Family[HistogramSeries]):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 buckets: Sequence[float], registry: CollectorRegistry | None = None) -> None:
        bounds = tuple(float(b) for b in buckets if b != float("inf"))
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"{name}: bucket bounds must be ascending and distinct")
        self.bounds = bounds
        self._le = (*(floatToGoString(b) for b in bounds), "+Inf")
        super().__init__(name, documentation, labelnames, registry,
                         lambda: HistogramSeries(bounds))

    def _empty(self) -> Metric:
        return Metric(self.name, self.documentation, "histogram")

    def collect(self) -> Iterable[Metric]:
        metric = self._empty()
        name, le_values, add = self.name, self._le, metric.samples.append
        with_sum = not self.bounds or self.bounds[0] >= 0  # as prometheus_client: no _sum
        for values, series in list(self.series.items()):  # when a bound is negative
            labels = self._labels_of(values)
            cumulative = 0.0
            for le, count in zip(le_values, series.counts, strict=True):
                cumulative += count
                add(Sample(name + "_bucket", {**labels, "le": le}, cumulative))
            add(Sample(name + "_count", labels, cumulative))
            if with_sum:
                add(Sample(name + "_sum", labels, series.sum))
            add(Sample(name + "_created", labels, series.created))
        return [metric]


class CounterFamily(_Family[CounterSeries]):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 registry: CollectorRegistry | None = None) -> None:
        super().__init__(name, documentation, labelnames, registry, CounterSeries)

    def _empty(self) -> Metric:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterable[Metric]:
        metric = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, series in list(self.series.items()):
            metric.add_metric(values, series.value, created=series.created)
        return [metric]


class GaugeFamily(_Family[GaugeSeries]):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 registry: CollectorRegistry | None = None) -> None:
        super().__init__(name, documentation, labelnames, registry, GaugeSeries)

    def _empty(self) -> Metric:
        return GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterable[Metric]:
        metric = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, series in list(self.series.items()):
            metric.add_metric(values, series.value)
        return [metric]
