"""Prometheus view of the shared limit store's health (read from the store's counters).

    routegate_limit_store_up                             1 while Redis answers in time
    routegate_limit_store_outages_total                  outages since start
    routegate_limit_store_fallback_admissions_total      decided locally (fail_open)
    routegate_limit_store_unavailable_rejections_total   refused (fail_closed)
    routegate_limit_store_lost_settlements_total         dropped from a full replay queue
    routegate_limit_store_out{reason}                    1 while out: unreachable or slow
    routegate_limit_store_slow_outages_total             outages because it was too slow
    routegate_limit_store_call_p99_seconds               its calls' p99 over the last
                                                         second or two (a histogram bound;
                                                         absent without calls)
"""

from __future__ import annotations

import time
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
                                "1 while the shared limit store answers in time.",
                                value=1 if store.healthy else 0)
        for name, doc, value in (
                ("outages", "Outages of the shared limit store.", store.outages),
                ("fallback_admissions", "Admissions decided locally during an outage.",
                 store.fallback_admissions),
                ("unavailable_rejections", "Requests refused during an outage (fail_closed).",
                 store.rejected_unavailable),
                ("lost_settlements", "Settlements dropped from a full replay queue.",
                 store.lost_settlements),
                ("slow_outages", "Outages because the store answered too slowly.",
                 store.slow_outages)):
            yield CounterMetricFamily(f"routegate_limit_store_{name}", doc, value=value)
        out = GaugeMetricFamily("routegate_limit_store_out",
                                "1 while the shared limit store is out, by reason.",
                                labels=["reason"])
        for reason in ("unreachable", "slow"):
            out.add_metric([reason], 1 if store.out_reason == reason else 0)
        yield out
        if store.window is not None:
            _, _, p99 = store.window.recent(time.monotonic())
            if p99 is not None:
                yield GaugeMetricFamily("routegate_limit_store_call_p99_seconds",
                                        "The p99 of the store's calls over the last second "
                                        "or two (the histogram bound it falls under).",
                                        value=p99)
