"""The shared key store: managed keys and the spend ledger in Redis, for every replica.

    {rg:keys}:records       hash   key id → the key record (JSON)
    {rg:keys}:seq           string the sequence number of the latest write
    {rg:keys}:changes       zset   key id, scored by the sequence of its latest write
    {rg:keys}:spend:DAY     hash   "tenant\\tkey\\tmodel\\troute\\tbackend\\tmeasure" → count
    {rg:keys}:totals        hash   key id → micro-dollars spent since it was created
    rg:keys:changed         pub/sub channel: the id of each key written

A write is one script (the record, its sequence number, its change entry and the
notification together), so a key is stored whole or not at all, and a replica that
missed the notification still finds it through `changes_since`. All keys share one hash
tag, so the scripts run on Redis Cluster too (where notifications are left out and the
periodic check alone keeps views current).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Sequence
from datetime import date, timedelta
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.keys.record import KeyRecord
from gateway.keys.store import KeyExists, KeyStoreUnavailable, SpendRow
from gateway.stores.redis import RedisClient, connect

T = TypeVar("T")

PREFIX = "{rg:keys}"
CHANNEL = "rg:keys:changed"
SPEND_TTL_S = 400 * 86_400  # a year of daily spend, and the month before it

_WRITE = """
if ARGV[3] == '1' and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return -1 end
if ARGV[3] == '0' and redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return -2 end
local seq = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], seq, ARGV[1])
if ARGV[4] ~= '' then redis.call('PUBLISH', ARGV[4], ARGV[1]) end
return seq
"""
_CHANGES = """
local out = {tonumber(redis.call('GET', KEYS[2]) or '0')}
local ids = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[1], '+inf')
for _, id in ipairs(ids) do
  out[#out + 1] = redis.call('HGET', KEYS[1], id)
end
return out
"""
_MEASURES = ("requests", "input_tokens", "output_tokens", "cost_micros")


class RedisKeyStore:
    name = "redis"

    def __init__(self, url: str, *, op_timeout_s: float = 1.0) -> None:
        self.url = url
        self.client: RedisClient = connect(url, socket_timeout_s=op_timeout_s / 2)
        self._op_timeout_s = op_timeout_s
        self._keys = [f"{PREFIX}:records", f"{PREFIX}:seq", f"{PREFIX}:changes"]
        self._write_script = self.client.register_script(_WRITE)
        self._changes_script = self.client.register_script(_CHANGES)
        self.notify = not url.startswith("redis+cluster://")

    async def _call(self, awaitable: Awaitable[T]) -> T:
        try:
            async with asyncio.timeout(self._op_timeout_s):
                return await awaitable
        except (RedisError, OSError, TimeoutError) as exc:
            raise KeyStoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc

    async def snapshot(self) -> tuple[list[KeyRecord], int]:
        return await self.changes_since(-1)

    async def sequence(self) -> int:
        return int(await self._call(self.client.get(self._keys[1])) or 0)

    async def changes_since(self, sequence: int) -> tuple[list[KeyRecord], int]:
        reply: list[Any] = await self._call(self._changes_script(
            keys=self._keys, args=[sequence]))
        return [KeyRecord.from_json(raw) for raw in reply[1:] if raw], int(reply[0])

    async def get(self, key_id: str) -> KeyRecord | None:
        raw = await self._call(self.client.hget(self._keys[0], key_id))
        return None if raw is None else KeyRecord.from_json(raw)

    async def create(self, record: KeyRecord) -> int:
        return await self._write(record, create=True)

    async def put(self, record: KeyRecord) -> int:
        return await self._write(record, create=False)

    async def _write(self, record: KeyRecord, *, create: bool) -> int:
        seq = int(await self._call(self._write_script(keys=self._keys, args=[
            record.id, record.to_json(), "1" if create else "0",
            CHANNEL if self.notify else ""])))
        if seq == -1:
            raise KeyExists(record.id)
        if seq == -2:
            raise KeyError(record.id)
        return seq

    def notifications(self) -> AsyncIterator[str] | None:
        return self._listen() if self.notify else None

    async def _listen(self) -> AsyncIterator[str]:
        """Ids as they are published; `KeyStoreUnavailable` when the subscription drops
        (the view resubscribes, and its check catches up meanwhile)."""
        client = self.client
        if not isinstance(client, aioredis.Redis):
            return
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        try:
            await self._call(pubsub.subscribe(CHANNEL))
            while True:
                try:
                    message = await pubsub.get_message(timeout=1.0)
                except (RedisError, OSError) as exc:
                    raise KeyStoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc
                if message is not None and message.get("type") == "message":
                    data = message["data"]
                    yield data.decode() if isinstance(data, bytes) else str(data)
        finally:
            try:
                async with asyncio.timeout(self._op_timeout_s):
                    await pubsub.aclose()
            except (RedisError, OSError, TimeoutError):
                pass

    async def add_spend(self, rows: Sequence[SpendRow]) -> None:
        if not rows:
            return
        pipe = self.client.pipeline(transaction=True)
        for row in rows:
            day_key = f"{PREFIX}:spend:{row.day}"
            prefix = "\t".join(row.dimensions[1:])
            for measure in _MEASURES:
                value = getattr(row, measure)
                if value:
                    pipe.hincrby(day_key, f"{prefix}\t{measure}", value)
            pipe.expire(day_key, SPEND_TTL_S)
            if row.key and row.cost_micros:
                pipe.hincrby(f"{PREFIX}:totals", row.key, row.cost_micros)
        await self._call(pipe.execute())

    async def spend(self, first_day: str, last_day: str) -> list[SpendRow]:
        days = _days(first_day, last_day)
        pipe = self.client.pipeline(transaction=False)
        for day in days:
            pipe.hgetall(f"{PREFIX}:spend:{day}")
        replies = await self._call(pipe.execute())
        rows: list[SpendRow] = []
        for day, fields in zip(days, replies, strict=True):
            merged: dict[tuple[str, ...], dict[str, int]] = {}
            for raw_field, raw_value in fields.items():
                parts = raw_field.decode().split("\t")
                merged.setdefault(tuple(parts[:5]), {})[parts[5]] = int(raw_value)
            rows += [SpendRow(day, dims[0], dims[1], dims[2], dims[3], dims[4],
                              *(measures.get(name, 0) for name in _MEASURES))
                     for dims, measures in merged.items()]
        return rows

    async def key_total_micros(self, key_ids: Sequence[str]) -> dict[str, int]:
        if not key_ids:
            return {}
        values = await self._call(self.client.hmget(f"{PREFIX}:totals", list(key_ids)))
        return {key: int(value) for key, value in zip(key_ids, values, strict=True)
                if value is not None}

    async def aclose(self) -> None:
        with contextlib.suppress(RedisError, OSError):
            await self.client.aclose()


def _days(first_day: str, last_day: str) -> list[str]:
    day, last = date.fromisoformat(first_day), date.fromisoformat(last_day)
    days = []
    while day <= last:
        days.append(day.isoformat())
        day += timedelta(days=1)
    return days
