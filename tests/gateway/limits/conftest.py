"""Stores under test: every behavioural test runs against memory, a real Redis and a
real 3-master Redis Cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.limits.memory import MemoryStore
from gateway.limits.redis_store import RedisStore
from gateway.limits.store import LimitStore
from gateway.stores.redis import connect
from tests.redis_cluster import RedisClusterNodes
from tests.redis_server import RedisServer


@pytest.fixture(params=["memory", "redis", "cluster"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[LimitStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    if request.param == "cluster":
        cluster: RedisClusterNodes = request.getfixturevalue("shared_redis_cluster")
        cluster.flush()
        url = cluster.url
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        url = server.url
    redis_store = RedisStore(connect(url))
    try:
        yield redis_store
    finally:
        await redis_store.aclose()
