"""Choose and open the limit store named by the policy (or `ROUTEGATE_REDIS_URL`).

The caller (app wiring) reads the environment and passes the URL in; this module
never reads it, so tests can build any store from plain values.
"""

from __future__ import annotations

from gateway.limits.failover import FailoverStore
from gateway.limits.memory import MemoryStore
from gateway.limits.redis_store import RedisStore, connect
from gateway.limits.store import LimitStore
from policies.schema import LimitStore as LimitStoreSettings


def store_url(settings: LimitStoreSettings, redis_url_env: str | None) -> str:
    """`ROUTEGATE_REDIS_URL` wins over the policy's `limits.store` (deployments set it)."""
    return redis_url_env or settings.store


def open_store(settings: LimitStoreSettings, *, url: str | None = None,
               probe_interval_s: float = 1.0, socket_timeout_s: float = 0.5) -> LimitStore:
    """A memory store, or Redis behind the policy's `on_store_error` behaviour.

    Nothing connects here: redis-py connects on first use, so a Redis that is down
    at start-up is handled like any later outage.
    """
    url = url or settings.store
    if url == "memory":
        return MemoryStore()
    primary = RedisStore(connect(url, socket_timeout_s=socket_timeout_s),
                         op_timeout_s=2 * socket_timeout_s)
    return FailoverStore(primary, on_error=settings.on_store_error,
                         replicas=settings.replicas, probe_interval_s=probe_interval_s)
