"""Every batch store keeps the same promises (SQLite, one Redis, a 3-master Redis
Cluster): one lease holder at a time, a lapsed lease taken over, a line's first stored
result kept, a cancel request shown as `cancelling`, a tenant's batches listed newest
first, file metadata kept until deleted."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from gateway.batches.model import Batch, FileObject, LineResult
from gateway.batches.redis_state import RedisState
from gateway.batches.state import BatchState, SqliteState
from tests.redis_cluster import RedisClusterNodes
from tests.redis_server import RedisServer


@pytest.fixture(params=["sqlite", "redis", "cluster"])
async def state(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BatchState]:
    store: BatchState
    if request.param == "sqlite":
        store = SqliteState(tmp_path / "batches.sqlite3")
    elif request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        store = RedisState(server.url)
    else:
        cluster: RedisClusterNodes = request.getfixturevalue("shared_redis_cluster")
        cluster.flush()
        store = RedisState(cluster.url)
    yield store
    await store.aclose()


def a_batch(batch_id: str = "batch_1", tenant: str = "acme") -> Batch:
    return Batch(id=batch_id, tenant=tenant, key_hash=None, endpoint="/v1/chat/completions",
                 input_file_id="file_1", completion_window="24h", window_s=86_400.0,
                 created_at=1, expires_at=86_401)


async def test_one_holder_at_a_time_and_a_lapsed_lease_is_taken_over(state: BatchState) -> None:
    await state.create(a_batch())
    assert await state.acquire("batch_1", "a", 0.3)
    assert await state.acquire("batch_1", "a", 0.3)  # renewed by its holder
    assert not await state.acquire("batch_1", "b", 0.3)
    await asyncio.sleep(0.4)
    assert await state.acquire("batch_1", "b", 0.3)
    await state.release("batch_1", "a")  # not its holder any more: nothing happens
    assert not await state.acquire("batch_1", "a", 0.3)


async def test_a_lines_first_stored_result_is_the_one_kept(state: BatchState) -> None:
    await state.create(a_batch())
    first = LineResult(index=3, custom_id="x", status=200, body={"n": 1}, request_id="r1")
    await state.put_result("batch_1", first)
    await state.put_result("batch_1", LineResult(index=3, custom_id="x", status=500,
                                                 body={}, request_id="r2"))
    assert (await state.results("batch_1")) == {3: first}


async def test_a_cancel_request_shows_as_cancelling_until_the_runner_finishes(
        state: BatchState) -> None:
    batch = a_batch()
    batch.status = "in_progress"
    await state.create(batch)
    await state.request_cancel("batch_1", 42)
    found = await state.get("batch_1")
    assert found is not None and found.status == "cancelling"
    assert found.times["cancelling_at"] == 42
    found.status = "cancelled"
    await state.save(found)
    done = await state.get("batch_1")
    assert done is not None and done.status == "cancelled"
    assert await state.unfinished() == []


async def test_a_tenants_batches_are_listed_newest_first_a_page_at_a_time(
        state: BatchState) -> None:
    for n in range(5):
        await state.create(a_batch(f"batch_{n}"))
    await state.create(a_batch("other", tenant="globex"))
    first = await state.listing("acme", None, 2)
    assert [b.id for b in first] == ["batch_4", "batch_3"]
    rest = await state.listing("acme", "batch_3", 10)
    assert [b.id for b in rest] == ["batch_2", "batch_1", "batch_0"]
    assert await state.listing("acme", "no-such-batch", 10) == []
    assert await state.listing("acme", "other", 10) == []  # another tenant's is no cursor
    assert sorted(await state.unfinished()) == sorted(
        [f"batch_{n}" for n in range(5)] + ["other"])


async def test_file_metadata_is_kept_until_deleted(state: BatchState) -> None:
    file = FileObject(id="file_1", bytes=120, created_at=7, filename="in.jsonl",
                      purpose="batch", tenant="acme", lines=3)
    await state.put_file(file)
    assert await state.get_file("file_1") == file
    assert await state.delete_file("file_1")
    assert await state.get_file("file_1") is None
    assert not await state.delete_file("file_1")


async def test_a_tenants_files_are_listed_in_upload_order_from_a_cursor(
        state: BatchState) -> None:
    def file(n: int, tenant: str = "acme", purpose: str = "batch") -> FileObject:
        return FileObject(id=f"file_{n}", bytes=1, created_at=7, filename="f.jsonl",
                          purpose=purpose, tenant=tenant)
    for n in range(4):
        await state.put_file(file(n, purpose="batch_output" if n == 2 else "batch"))
    await state.put_file(file(9, tenant="globex"))

    async def ids(purpose: str | None = None, after: str | None = None, limit: int = 10,
                  newest_first: bool = True) -> list[str]:
        return [f.id for f in await state.file_listing("acme", purpose, after, limit,
                                                        newest_first, now=1_000.0)]
    assert await ids() == ["file_3", "file_2", "file_1", "file_0"]
    assert await ids(after="file_2", limit=1) == ["file_1"]
    assert await ids(newest_first=False, after="file_1") == ["file_2", "file_3"]
    assert await ids(purpose="batch") == ["file_3", "file_1", "file_0"]
    assert await ids(purpose="batch", after="file_3", limit=1) == ["file_1"]
    assert await ids(after="file_9") == []  # another tenant's file is no cursor
    await state.delete_file("file_1")
    assert await ids() == ["file_3", "file_2", "file_0"]


async def test_a_state_file_from_before_the_files_listing_lists_its_files(
        tmp_path: Path) -> None:
    path = tmp_path / "batches.sqlite3"
    with sqlite3.connect(path) as old:
        old.execute("CREATE TABLE files (id TEXT PRIMARY KEY, data BLOB NOT NULL)")
        for n, created in ((0, 100), (1, 200)):
            old.execute("INSERT INTO files VALUES (?, ?)", (f"file_{n}", orjson.dumps({
                "id": f"file_{n}", "bytes": 1, "created_at": created, "filename": "f",
                "purpose": "batch", "tenant": "acme", "lines": 1})))
    old.close()
    state = SqliteState(path)
    try:
        assert [f.id for f in await state.file_listing(
            "acme", None, None, 10, True, now=0.0)] == ["file_1", "file_0"]
        assert await state.expired_files(now=10**10, limit=10) == []  # none had a lifetime
        assert await state.get_file("file_0") is not None
    finally:
        await state.aclose()


async def test_an_expired_file_is_no_longer_listed_and_is_handed_to_the_sweep(
        state: BatchState) -> None:
    def file(n: int, expires_at: int | None) -> FileObject:
        return FileObject(id=f"file_{n}", bytes=1, created_at=7, filename="f.jsonl",
                          purpose="batch", tenant="acme", expires_at=expires_at)
    await state.put_file(file(0, None))
    await state.put_file(file(1, 2_000))
    await state.put_file(file(2, 3_000))

    listed = await state.file_listing("acme", None, None, 10, True, now=2_500.0)
    assert [f.id for f in listed] == ["file_2", "file_0"]
    assert [f.id for f in await state.expired_files(now=2_500.0, limit=10)] == ["file_1"]
    assert [f.id for f in await state.expired_files(now=3_000.0, limit=1)] == ["file_1"]
    await state.delete_file("file_1")
    assert [f.id for f in await state.expired_files(now=3_000.0, limit=10)] == ["file_2"]
    assert (await state.get_file("file_2")) == file(2, 3_000)
