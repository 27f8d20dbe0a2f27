"""Prometheus view of the response cache, per route (route names come from the policy).

    routegate_cache_hits_total / _misses_total / _bypasses_total
    routegate_cache_store_errors_total         lookups and writes the store failed
    routegate_cache_kept_bytes_total           bytes written to the store
    routegate_cache_served_bytes_total         bytes answered from it
    routegate_cache_saved_micro_usd_total      what the hits' misses were charged
    routegate_cache_memory_bytes               held by the in-process store (no route)
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.cache.response_cache import ResponseCache
from gateway.stores.blobs import MemoryBlobs

_COUNTERS = (
    ("hits", "Requests answered from the response cache.", "hits"),
    ("misses", "Cacheable requests a backend answered.", "misses"),
    ("bypasses", "Requests on a cached route the cache did not serve (rules, "
                 "Cache-Control, store down).", "bypasses"),
    ("store_errors", "Response cache lookups and writes its store failed.", "store_errors"),
    ("kept_bytes", "Bytes written to the response cache.", "kept_bytes"),
    ("served_bytes", "Bytes answered from the response cache.", "served_bytes"),
    ("saved_micro_usd", "What requests answered from the cache would have cost (µUSD).",
     "saved_micros"),
)


class CacheCollector(Collector):
    def __init__(self, cache: ResponseCache) -> None:
        self.cache = cache

    def collect(self) -> Iterator[Metric]:
        counts = list(self.cache.counts.items())
        for name, doc, field in _COUNTERS:
            family = CounterMetricFamily(f"routegate_cache_{name}", doc, labels=["route"])
            for route, route_counts in counts:
                family.add_metric([route], getattr(route_counts, field))
            yield family
        if isinstance(self.cache.blobs, MemoryBlobs):
            yield GaugeMetricFamily("routegate_cache_memory_bytes",
                                    "Bytes held by the in-process response cache.",
                                    value=self.cache.blobs.bytes)
