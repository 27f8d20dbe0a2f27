"""Batch state in Redis, shared by every replica: any replica answers `retrieve`, and
the lease (a key with a TTL, taken and renewed by one script) lets exactly one run a
batch; when its holder dies the key expires and another replica takes the batch over.

    rg:{batches}:batch:ID            hash: data (the batch), cancel_at, tenant
    rg:{batches}:batch:ID:results    hash: line number → the line's result
    rg:{batches}:batch:ID:lease      the holder's name, expiring after `lease_s`
    rg:{batches}:tenant:TENANT       sorted set of the tenant's batch ids by creation time
    rg:{batches}:unfinished          set of batch ids not yet final
    rg:{batches}:file:ID             a file's metadata (its bytes are in the data directory)
    rg:{batches}:files:TENANT        sorted set of the tenant's file ids by upload time
    rg:{batches}:file_expiry         sorted set of file ids by `expires_at` (those that have one)

Standalone, Sentinel and Cluster URLs (`gateway.stores.redis`). Every key carries one
hash tag, `{batches}`, so a batch's creation (its hash, its tenant's index, the set of
unfinished batches) is one transaction on one Cluster node: batch state is small and
written once per line, so it gains nothing from being spread over the cluster.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from gateway.batches.model import Batch, FileObject, LineResult
from gateway.batches.state import result_json, result_of, with_cancel
from gateway.stores.redis import connect

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
_PREFIX = "rg:{batches}:"
_UNFINISHED = f"{_PREFIX}unfinished"
_FILE_EXPIRY = f"{_PREFIX}file_expiry"
SOCKET_TIMEOUT_S = 5.0


def _batch(batch_id: str) -> str:
    return f"{_PREFIX}batch:{batch_id}"


def _file(file_id: str) -> str:
    return f"{_PREFIX}file:{file_id}"


def _tenant_index(tenant: str) -> str:
    return f"{_PREFIX}tenant:{tenant}"


def _tenant_files(tenant: str) -> str:
    return f"{_PREFIX}files:{tenant}"


class RedisState:
    def __init__(self, url: str) -> None:
        self._redis = connect(url, socket_timeout_s=SOCKET_TIMEOUT_S)
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._release = self._redis.register_script(_RELEASE)

    async def put_file(self, file: FileObject) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(_file(file.id), orjson.dumps(
                {name: getattr(file, name) for name in FileObject.__slots__}))
            pipe.zadd(_tenant_files(file.tenant), {file.id: time.time()})
            if file.expires_at is not None:
                pipe.zadd(_FILE_EXPIRY, {file.id: file.expires_at})
            await pipe.execute()

    async def get_file(self, file_id: str) -> FileObject | None:
        data = await self._redis.get(_file(file_id))
        return None if data is None else FileObject(**orjson.loads(data))

    async def delete_file(self, file_id: str) -> bool:
        file = await self.get_file(file_id)
        if file is None:
            return False
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(_file(file_id))
            pipe.zrem(_tenant_files(file.tenant), file_id)
            pipe.zrem(_FILE_EXPIRY, file_id)
            deleted, _, _ = await pipe.execute()
        return bool(deleted)

    async def expired_files(self, now: float, limit: int) -> list[FileObject]:
        ids: list[Any] = await self._redis.zrangebyscore(_FILE_EXPIRY, "-inf", now, 0, limit)
        if not ids:
            return []
        found = await self._redis.mget([_file(i.decode()) for i in ids])
        gone = [i for i, data in zip(ids, found, strict=True) if data is None]
        if gone:  # deleted by another replica's sweep between the two reads
            await self._redis.zrem(_FILE_EXPIRY, *gone)
        return [FileObject(**orjson.loads(data)) for data in found if data is not None]

    async def file_listing(self, tenant: str, purpose: str | None, after: str | None,
                           limit: int, newest_first: bool, now: float) -> list[FileObject]:
        index = _tenant_files(tenant)
        start = 0
        if after is not None:
            rank: Any = await (self._redis.zrevrank(index, after) if newest_first
                               else self._redis.zrank(index, after))
            if rank is None:
                return []
            start = int(rank) + 1
        found: list[FileObject] = []
        chunk = max(limit, 100)  # read ahead: `purpose` may skip some
        read = self._redis.zrevrange if newest_first else self._redis.zrange
        while len(found) < limit:
            ids: list[Any] = await read(index, start, start + chunk - 1)
            if not ids:
                break
            start += len(ids)
            for data in await self._redis.mget([_file(i.decode()) for i in ids]):
                if data is None:
                    continue  # deleted since the ids were read
                file = FileObject(**orjson.loads(data))
                if (purpose is None or file.purpose == purpose) and not file.expired(now):
                    found.append(file)
        return found[:limit]

    async def create(self, batch: Batch) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(_batch(batch.id), mapping={"data": orjson.dumps(batch.stored()),
                                                 "tenant": batch.tenant})
            pipe.zadd(_tenant_index(batch.tenant), {batch.id: time.time()})  # ordered to the µs
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
        index = _tenant_index(tenant)
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
