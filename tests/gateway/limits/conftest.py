"""Stores under test: every behavioural test runs against memory and a real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gateway.limits.memory import MemoryStore
from gateway.limits.redis_store import RedisStore, connect
from gateway.limits.store import LimitStore
from tests.redis_server import RedisServer


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[LimitStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    redis_store = RedisStore(connect(server.url))
    try:
        yield redis_store
    finally:
        await redis_store.aclose()
