"""What both key stores promise, checked on each: SQLite (embedded) and a real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.keys.record import KeyRecord
from gateway.keys.redis_store import RedisKeyStore
from gateway.keys.sqlite_store import SqliteKeyStore
from gateway.keys.store import KeyExists, KeyStore, SpendRow
from tests.redis_server import RedisServer

T0 = 1_764_700_000.0


def _key(key_id: str, tenant: str = "acme") -> KeyRecord:
    return KeyRecord(id=key_id, key_hash=f"sha256:{key_id:0>64}", tenant=tenant,
                     labels=("a",), requests_per_minute=5, budget_total_micros=7,
                     created_at=T0, updated_at=T0)


@pytest.fixture(params=["embedded", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[KeyStore]:
    made: KeyStore
    if request.param == "embedded":
        made = SqliteKeyStore(tmp_path / "keys.sqlite3")
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        made = RedisKeyStore(server.url)
    yield made
    await made.aclose()


async def test_a_created_key_reads_back_whole(store: KeyStore) -> None:
    record = _key("k1")
    await store.create(record)
    assert await store.get("k1") == record
    records, sequence = await store.snapshot()
    assert records == [record] and sequence == await store.sequence() == 1


async def test_creating_an_existing_id_fails_and_changes_nothing(store: KeyStore) -> None:
    await store.create(_key("k1"))
    with pytest.raises(KeyExists):
        await store.create(_key("k1", tenant="globex"))
    stored = await store.get("k1")
    assert stored is not None and stored.tenant == "acme"


async def test_changes_since_returns_only_later_writes(store: KeyStore) -> None:
    await store.create(_key("k1"))
    await store.create(_key("k2"))
    _, sequence = await store.snapshot()
    await store.put(_key("k1").updated(T0 + 1, name="renamed"))
    changed, now = await store.changes_since(sequence)
    assert [record.name for record in changed] == ["renamed"] and now == sequence + 1
    assert await store.changes_since(now) == ([], now)


async def test_spend_rows_add_up_per_day_and_dimensions(store: KeyStore) -> None:
    row = SpendRow("2026-12-01", "acme", "k1", "chat", "chat", "up", 1, 10, 20, 300)
    await store.add_spend([row, SpendRow("2026-12-02", "acme", "", "chat", "chat", "up",
                                         1, 1, 1, 5)])
    await store.add_spend([row])
    rows = await store.spend("2026-12-01", "2026-12-01")
    assert rows == [SpendRow("2026-12-01", "acme", "k1", "chat", "chat", "up", 2, 20, 40, 600)]
    assert len(await store.spend("2026-11-30", "2026-12-31")) == 2
    assert await store.key_total_micros(["k1", "k9"]) == {"k1": 600}


async def test_an_embedded_store_leaves_no_file_until_a_key_is_written(tmp_path: Path) -> None:
    store = SqliteKeyStore(tmp_path / "keys.sqlite3")
    assert await store.snapshot() == ([], 0)
    assert not (tmp_path / "keys.sqlite3").exists()
    await store.create(_key("k1"))
    assert (tmp_path / "keys.sqlite3").exists()
    await store.aclose()
