"""Bytes under string keys, each with a time to live: in this process or in Redis.

    MemoryBlobs(max_bytes)   an LRU bounded in bytes (keys and values counted); the
                             least recently used entries go first when a write needs room
    RedisBlobs(client)       shared by every replica and worker: SET with PX, GET, DEL;
                             every call bounded by `op_timeout_s`, and for `retry_after_s`
                             after a failure not tried at all (an outage costs requests
                             nothing, rather than a timeout each)

Both raise `BlobStoreUnavailable` only from Redis (down, slow, refused): each caller
decides what an outage means for it (the response cache: no cache; stored responses:
a 503 on read).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol

from redis.exceptions import RedisError

from gateway.stores.redis import RedisClient, connect


class BlobStoreUnavailable(Exception):
    pass


class BlobStore(Protocol):
    async def get(self, key: str) -> bytes | None: ...
    async def put(self, key: str, value: bytes, ttl_s: float) -> None: ...
    async def delete(self, key: str) -> bool: ...
    async def aclose(self) -> None: ...


class MemoryBlobs:
    def __init__(self, max_bytes: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._clock = clock
        self._entries: OrderedDict[str, tuple[bytes, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, key: str) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry[0]

    async def put(self, key: str, value: bytes, ttl_s: float) -> None:
        size = len(key) + len(value)
        if size > self.max_bytes:
            return  # could never fit: kept nowhere rather than emptying the store for it
        if key in self._entries:
            self._drop(key)
        while self.bytes + size > self.max_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[key] = (value, self._clock() + ttl_s)
        self.bytes += size

    async def delete(self, key: str) -> bool:
        if key not in self._entries:
            return False
        self._drop(key)
        return True

    def _drop(self, key: str) -> None:
        value, _ = self._entries.pop(key)
        self.bytes -= len(key) + len(value)

    async def aclose(self) -> None:
        self._entries.clear()
        self.bytes = 0


class RedisBlobs:
    def __init__(self, client: RedisClient, *, op_timeout_s: float = 1.0,
                 retry_after_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.op_timeout_s = op_timeout_s
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._retry_at = 0.0  # after a failure: no call before this

    @classmethod
    def at(cls, url: str, *, socket_timeout_s: float = 0.5,
           retry_after_s: float = 1.0) -> RedisBlobs:
        """Nothing connects here: a Redis that is down at start-up is an outage like
        any later one."""
        return cls(connect(url, socket_timeout_s=socket_timeout_s),
                   op_timeout_s=2 * socket_timeout_s, retry_after_s=retry_after_s)

    async def get(self, key: str) -> bytes | None:
        value = await self._call(lambda: self.client.get(key))
        return value if isinstance(value, bytes) else None

    async def put(self, key: str, value: bytes, ttl_s: float) -> None:
        await self._call(lambda: self.client.set(key, value, px=max(1, int(ttl_s * 1000))))

    async def delete(self, key: str) -> bool:
        return bool(await self._call(lambda: self.client.delete(key)))

    async def _call(self, operation: Callable[[], Awaitable[object]]) -> object:
        if self._retry_at and self._clock() < self._retry_at:
            raise BlobStoreUnavailable("Redis failed moments ago; not tried again yet")
        try:
            async with asyncio.timeout(self.op_timeout_s):
                result = await operation()
        except (RedisError, OSError, TimeoutError) as exc:
            self._retry_at = self._clock() + self.retry_after_s
            raise BlobStoreUnavailable(f"Redis: {exc.__class__.__name__}: {exc}") from exc
        self._retry_at = 0.0
        return result

    async def aclose(self) -> None:
        await self.client.aclose()


def open_blobs(store: str, max_memory_bytes: int) -> BlobStore:
    """`memory` or a redis:// URL (as the policy names it)."""
    return MemoryBlobs(max_memory_bytes) if store == "memory" else RedisBlobs.at(store)
