"""Prometheus series of fleets, read from their live state when `/metrics` is read:

    routegate_replica_outstanding{backend,replica}      requests this gateway has there
    routegate_replica_waiting{backend,replica}          its own queue (its /metrics)
    routegate_replica_kv_cache_use{backend,replica}     0..1 (its /metrics)
    routegate_replica_in_service{backend,replica}       0 while ejected or down
    routegate_prompt_tokens_total{backend,replica}      prompt tokens of answered requests
                                                        (every backend; replica "" unless
                                                        a fleet's)
    routegate_cached_prompt_tokens_total{backend,replica}  … of them read from its cache

`replica` is host:port, empty for a dedicated backend with one URL; the hit rate is
cached ÷ prompt tokens.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.route.replica_call import ReplicaChooser
from gateway.telemetry.prompt_tokens import PromptTokens

LABELS = ["backend", "replica"]


class ReplicaCollector(Collector):
    def __init__(self, chooser: ReplicaChooser, tokens: PromptTokens) -> None:
        self.chooser = chooser
        self.tokens = tokens

    def collect(self) -> Iterator[Metric]:
        gauges = {name: GaugeMetricFamily(f"routegate_replica_{name}", doc, labels=LABELS)
                  for name, doc in (
                      ("outstanding", "Requests this gateway has outstanding on a replica."),
                      ("waiting", "Requests waiting in a replica's own queue."),
                      ("kv_cache_use", "A replica's KV-cache use, 0..1."),
                      ("in_service", "1 while a replica is in service, 0 while out."))}
        now = time.monotonic()
        for name, fleet in self.chooser.fleets.fleets.items():
            ejected = fleet.health.snapshot().ejected
            targets = fleet.health.snapshot().targets
            for replica in fleet.replicas.values():
                labels = [name, replica.name]
                view = replica.view(now, None)
                gauges["outstanding"].add_metric(labels, replica.outstanding)
                if view.waiting is not None:
                    gauges["waiting"].add_metric(labels, view.waiting)
                if view.kv_use is not None:
                    gauges["kv_cache_use"].add_metric(labels, view.kv_use)
                out = ejected.get(replica.name, now) > now or not (
                    targets.get(replica.name) is None or targets[replica.name].healthy(now))
                gauges["in_service"].add_metric(labels, 0.0 if out else 1.0)
        yield from gauges.values()
        prompt = CounterMetricFamily("routegate_prompt_tokens",
                                     "Prompt tokens of answered requests, per backend and "
                                     "fleet replica.", labels=LABELS)
        cached = CounterMetricFamily("routegate_cached_prompt_tokens",
                                     "Prompt tokens a backend read from its prefix cache "
                                     "(usage.prompt_tokens_details.cached_tokens).",
                                     labels=LABELS)
        for (backend, where), (_, prompt_tokens, cached_tokens) in sorted(
                self.tokens.counts.items()):
            prompt.add_metric([backend, where], prompt_tokens)
            cached.add_metric([backend, where], cached_tokens)
        yield prompt
        yield cached
