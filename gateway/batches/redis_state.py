"""Batch state in Redis, shared by every replica: any replica answers `retrieve`, and
the lease (a key with a TTL, taken and renewed by one script) lets exactly one run a
batch; when its holder dies the key expires and another replica takes the batch over.

    rg:batch:{id}            hash: data (the batch), cancel_at, tenant
    rg:batch:{id}:results    hash: line number → the line's result
    rg:batch:{id}:lease      the holder's name, expiring after `lease_s`
    rg:batches:{tenant}      sorted set of the tenant's batch ids by creation time
    rg:batches:unfinished    set of batch ids not yet final
    rg:file:{id}             a file's metadata (its bytes are in the data directory)

Plain `redis://` URLs (standalone); every key of one batch carries its id as a hash tag.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import redis.asyncio as aioredis

from gateway.batches.model import Batch, FileObject, LineResult
from gateway.batches.state import result_json, result_of, with_cancel

# KEYS[1] lease, ARGV holder, ttl_ms: take a free or own lease, renew it; 1 if held
_ACQUIRE = """
local holder = redis.call('GET', KEYS[1])
if holder == false or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_UNFINISHED = "rg:batches:unfinished"
SOCKET_TIMEOUT_S = 5.0


def _batch(batch_id: str) -> str:
    return f"rg:batch:{{{batch_id}}}"


class RedisState:
    def __init__(self, url: str) -> None:
        self._redis: aioredis.Redis = aioredis.from_url(
            url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S)
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._release = self._redis.register_script(_RELEASE)

    async def put_file(self, file: FileObject) -> None:
        await self._redis.set(f"rg:file:{file.id}", orjson.dumps(
            {name: getattr(file, name) for name in FileObject.__slots__}))

    async def get_file(self, file_id: str) -> FileObject | None:
        data = await self._redis.get(f"rg:file:{file_id}")
        return None if data is None else FileObject(**orjson.loads(data))

    async def delete_file(self, file_id: str) -> bool:
        return bool(await self._redis.delete(f"rg:file:{file_id}"))

    async def create(self, batch: Batch) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(_batch(batch.id), mapping={"data": orjson.dumps(batch.stored()),
                                                 "tenant": batch.tenant})
            pipe.zadd(f"rg:batches:{batch.tenant}", {batch.id: time.time()})  # ordered to the µs
            pipe.sadd(_UNFINISHED, batch.id)
            await pipe.execute()

    async def get(self, batch_id: str) -> Batch | None:
        data, cancel = await self._redis.hmget(_batch(batch_id), ["data", "cancel_at"])
        return None if data is None else _batch_of(data, cancel)

    async def save(self, batch: Batch) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(_batch(batch.id), "data", orjson.dumps(batch.stored()))
            if batch.final:
                pipe.srem(_UNFINISHED, batch.id)
            await pipe.execute()

    async def listing(self, tenant: str, after: str | None, limit: int) -> list[Batch]:
        index = f"rg:batches:{tenant}"
        start = 0
        if after is not None:
            rank: Any = await self._redis.zrevrank(index, after)
            if rank is None:
                return []
            start = int(rank) + 1
        ids: list[Any] = await self._redis.zrevrange(index, start, start + limit - 1)
        found = []
        for batch_id in ids:
            batch = await self.get(batch_id.decode())
            if batch is not None:
                found.append(batch)
        return found

    async def request_cancel(self, batch_id: str, at: int) -> None:
        await self._redis.hsetnx(_batch(batch_id), "cancel_at", at)

    async def cancel_requested(self, batch_id: str) -> int | None:
        value = await self._redis.hget(_batch(batch_id), "cancel_at")
        return None if value is None else int(value)

    async def unfinished(self) -> list[str]:
        members: set[Any] = await self._redis.smembers(_UNFINISHED)
        return sorted(member.decode() for member in members)

    async def put_result(self, batch_id: str, result: LineResult) -> None:
        await self._redis.hsetnx(f"{_batch(batch_id)}:results", str(result.index),
                                 result_json(result))

    async def results(self, batch_id: str) -> dict[int, LineResult]:
        stored = await self._redis.hgetall(f"{_batch(batch_id)}:results")
        return {int(line): result_of(data) for line, data in stored.items()}

    async def acquire(self, batch_id: str, holder: str, lease_s: float) -> bool:
        return bool(await self._acquire(keys=[f"{_batch(batch_id)}:lease"],
                                        args=[holder, int(lease_s * 1000)]))

    async def holder(self, batch_id: str) -> str | None:
        """Who holds the batch's lease now (None: no one)."""
        value: Any = await self._redis.get(f"{_batch(batch_id)}:lease")
        return None if value is None else value.decode()

    async def release(self, batch_id: str, holder: str) -> None:
        await self._release(keys=[f"{_batch(batch_id)}:lease"], args=[holder])

    async def aclose(self) -> None:
        await self._redis.aclose()


def _batch_of(data: Any, cancel: Any) -> Batch:
    return with_cancel(Batch.from_stored(orjson.loads(data)),
                       None if cancel is None else int(cancel))
