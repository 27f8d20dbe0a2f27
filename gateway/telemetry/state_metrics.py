"""Prometheus view of what the gateway runs with, read at scrape time.

    routegate_backend_state{backend, state}        1 for the backend's state, 0 for the others
    routegate_policy_info{version, source}         1: the running policy's version hash
    routegate_policy_loaded_timestamp_seconds      when that policy was loaded (Unix time)

A backend is `ready` (requests can be sent to it), `starting` (a launched local
backend not answering yet), `down` (a URL it cannot use) or `disabled` (switched off
in the policy). An alert on `routegate_backend_state{state="ready"} == 0` sees a
backend fall out; a changed `version` label shows a reload took effect.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.core.live_policy import LivePolicy
from gateway.telemetry.metrics import GatewayMetrics
from gateway.upstream.pool import UpstreamPool
from policies.load import Policy

STATES = ("ready", "starting", "down", "disabled")


class StateCollector(Collector):
    def __init__(self, live: LivePolicy, pool: UpstreamPool, metrics: GatewayMetrics, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.live = live
        self.pool = pool
        self.metrics = metrics
        self._clock = clock
        self.loaded_at = clock()
        live.on_swap(self._swapped)

    def _swapped(self, policy: Policy) -> None:
        self.loaded_at = self._clock()

    def states(self, policy: Policy) -> dict[str, str]:
        report = self.pool.status(policy)
        states = {}
        for name, backend in policy.file.backends.items():
            if not backend.enabled:
                states[name] = "disabled"
            elif report.get(name) == "ready":
                states[name] = "ready"
            else:
                states[name] = "starting" if backend.launch is not None else "down"
        return states

    def dashboard(self) -> dict[str, Any]:
        """The dashboard's view of the same: the policy, and each backend's state with
        its requests in flight and waiting in the gateway's queue."""
        policy = self.live.current
        in_flight, queued = self.metrics.in_flight.series, self.metrics.queue_depth.series
        health = {}
        for name, state in self.states(policy).items():
            flying, waiting = in_flight.get((name,)), queued.get((name,))
            health[name] = {"state": state,
                            "in_flight": int(flying.value) if flying is not None else 0,
                            "queue_depth": int(waiting.value) if waiting is not None else 0}
        return {"policy": {"version": policy.version_hash or None, "source": policy.source,
                           "loaded_at": self.loaded_at},
                "health": health}

    def collect(self) -> Iterator[Metric]:
        policy = self.live.current
        state = GaugeMetricFamily(
            "routegate_backend_state",
            "1 for each backend's state (ready | starting | down | disabled), 0 for the others.",
            labels=["backend", "state"])
        for name, current in self.states(policy).items():
            for candidate in STATES:
                state.add_metric([name, candidate], 1 if candidate == current else 0)
        yield state
        info = GaugeMetricFamily("routegate_policy_info", "The running policy (always 1).",
                                 labels=["version", "source"])
        info.add_metric([policy.version_hash or "none", policy.source], 1)
        yield info
        yield GaugeMetricFamily("routegate_policy_loaded_timestamp_seconds",
                                "When the running policy was loaded (Unix time).",
                                value=self.loaded_at)
