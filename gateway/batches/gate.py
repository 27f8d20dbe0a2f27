"""Spare capacity: may a batch line go to a dedicated target now? Only while the
gateway's queue for it holds no waiter, its slots in use stay below
`batches.spare_queue_use` of its `max_concurrency`, and the backend's own report (its
/metrics: waiting requests, KV-cache use) shows room. Interactive traffic therefore
always finds free slots; batch lines fill what it leaves."""

from __future__ import annotations

import time

from gateway.queueing.queues import BackendQueues
from policies.batch_schema import Batches
from policies.load import ModelTarget
from routing.stats import LiveStats


class SpareCapacity:
    def __init__(self, queues: BackendQueues, stats: LiveStats) -> None:
        self.queues = queues
        self.stats = stats

    def why_not(self, target: ModelTarget, settings: Batches, starting: int = 0) -> str | None:
        """None when `target` has room for one more batch line (`starting`: lines already
        sent its way that do not hold a slot yet); else why not."""
        for key in self.queues.queue_keys(target):
            snapshot = self.queues.snapshot(key)
            if snapshot.waiting:
                return f"{key}: {snapshot.waiting} waiting"
            if snapshot.limit is not None and \
                    snapshot.in_flight + starting + 1 > settings.spare_queue_use * snapshot.limit:
                return f"{key}: {snapshot.in_flight} of {snapshot.limit} slots in use"
        load = self.stats.snapshot().target(target.key)
        if load.load_is_fresh(time.monotonic()):  # the load poller's clock
            if load.backend_waiting:
                return f"{target.key}: the backend reports {load.backend_waiting} waiting"
            if load.kv_cache_use is not None and load.kv_cache_use >= settings.spare_kv_use:
                return f"{target.key}: KV cache {load.kv_cache_use:.0%} used"
        return None
