"""Choose and open the limit store named by the policy (or `ROUTEGATE_REDIS_URL`).

The caller (app wiring) reads the environment and passes the URL in; this module
never reads it, so tests can build any store from plain values.
"""

from __future__ import annotations

from gateway.limits.failover import FailoverStore
from gateway.limits.memory import MemoryStore
from gateway.limits.redis_store import RedisStore
from gateway.limits.store import LimitStore
from gateway.limits.store_latency import LatencyBudget
from gateway.stores.redis import connect
from policies.schema import LimitStore as LimitStoreSettings


def store_url(settings: LimitStoreSettings, redis_url_env: str | None) -> str:
    """`ROUTEGATE_REDIS_URL` wins over the policy's `limits.store` (deployments set it)."""
    return redis_url_env or settings.store


def latency_budget(settings: LimitStoreSettings) -> LatencyBudget:
    latency = settings.store_latency
    return LatencyBudget(p99_s=None if latency.p99_ms is None else latency.p99_ms / 1000,
                         window_s=latency.window_s,
                         call_timeout_s=latency.call_timeout_ms / 1000)


def open_store(settings: LimitStoreSettings, *, url: str | None = None,
               probe_interval_s: float = 1.0) -> LimitStore:
    """A memory store, or Redis behind the policy's `on_store_error` behaviour.

    Nothing connects here: redis-py connects on first use, so a Redis that is down
    at start-up is handled like any later outage. A call is bounded by
    `store_latency.call_timeout_ms`, a socket operation by half of it.
    """
    url = url or settings.store
    if url == "memory":
        return MemoryStore()
    budget = latency_budget(settings)
    primary = RedisStore(connect(url, socket_timeout_s=budget.call_timeout_s / 2),
                         op_timeout_s=budget.call_timeout_s)
    return FailoverStore(primary, on_error=settings.on_store_error,
                         replicas=settings.replicas, probe_interval_s=probe_interval_s,
                         latency=budget)
