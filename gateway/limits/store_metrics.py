"""Prometheus view of the shared limit store's health (read from the store's counters).

    routegate_limit_store_up                             1 while Redis answers
    routegate_limit_store_outages_total                  outages since start
    routegate_limit_store_fallback_admissions_total      decided locally (fail_open)
    routegate_limit_store_unavailable_rejections_total   refused (fail_closed)
    routegate_limit_store_lost_settlements_total         dropped from a full replay queue
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.limits.failover import FailoverStore


class StoreCollector(Collector):
    def __init__(self, store: FailoverStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        store = self.store
        yield GaugeMetricFamily("routegate_limit_store_up",
                                "1 while the shared limit store answers.",
                                value=1 if store.healthy else 0)
        for name, doc, value in (
                ("outages", "Outages of the shared limit store.", store.outages),
                ("fallback_admissions", "Admissions decided locally during an outage.",
                 store.fallback_admissions),
                ("unavailable_rejections", "Requests refused during an outage (fail_closed).",
                 store.rejected_unavailable),
                ("lost_settlements", "Settlements dropped from a full replay queue.",
                 store.lost_settlements)):
            yield CounterMetricFamily(f"routegate_limit_store_{name}", doc, value=value)
