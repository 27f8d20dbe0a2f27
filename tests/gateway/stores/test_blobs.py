"""The bytes stores behind stored responses and the response cache."""

from __future__ import annotations

import pytest

from gateway.stores.blobs import BlobStoreUnavailable, MemoryBlobs, RedisBlobs
from gateway.stores.redis import connect
from tests.redis_server import RedisServer


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_the_memory_store_stays_within_its_bytes_dropping_the_least_recently_used(
) -> None:
    store = MemoryBlobs(max_bytes=30)
    await store.put("a", b"x" * 9, 60)  # 10 bytes with its key
    await store.put("b", b"x" * 9, 60)
    await store.put("c", b"x" * 9, 60)
    await store.get("a")  # used: "b" is now the oldest

    await store.put("d", b"x" * 9, 60)

    assert store.bytes <= 30 and len(store) == 3
    assert await store.get("b") is None and await store.get("a") is not None


async def test_the_memory_store_forgets_an_entry_past_its_ttl_and_skips_what_never_fits(
) -> None:
    clock = Clock()
    store = MemoryBlobs(max_bytes=100, clock=clock)
    await store.put("k", b"value", ttl_s=5)
    await store.put("huge", b"x" * 200, ttl_s=5)
    clock.now = 5.0

    assert await store.get("k") is None and await store.get("huge") is None
    assert store.bytes == 0


async def test_a_redis_store_that_is_down_raises_its_own_error_and_rests_before_retrying(
        redis_server: RedisServer) -> None:
    clock = Clock()
    store = RedisBlobs(connect(redis_server.url), retry_after_s=1.0, clock=clock)
    await store.put("k", b"v", ttl_s=60)
    assert await store.get("k") == b"v"
    redis_server.kill()
    with pytest.raises(BlobStoreUnavailable):
        await store.get("k")
    redis_server.start()

    with pytest.raises(BlobStoreUnavailable, match="not tried again yet"):
        await store.get("k")  # Redis is back, but the store rests after a failure
    clock.now = 1.0
    await store.put("k", b"again", ttl_s=60)
    assert await store.get("k") == b"again"
    await store.aclose()
