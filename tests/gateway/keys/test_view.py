"""The view authentication reads: a dict lookup, no store call per request, and what
it answers while the store is out."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from gateway.keys.record import KeyRecord
from gateway.keys.sqlite_store import SqliteKeyStore
from gateway.keys.view import KeysUnavailable, KeyView
from policies.keys_schema import KeyService

T0 = 1_764_700_000.0
HASH = "sha256:" + "ab" * 32


class CountingStore(SqliteKeyStore):
    """The embedded store, counting the calls made to it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.calls = 0

    async def sequence(self) -> int:
        self.calls += 1
        return await super().sequence()


def _view(store: SqliteKeyStore, **settings: object) -> KeyView:
    return KeyView(store, KeyService.model_validate(settings), clock=lambda: T0)


async def test_authentication_reads_memory_only(tmp_path: Path) -> None:
    store = CountingStore(tmp_path / "k.sqlite3")
    await store.create(KeyRecord("k1", HASH, "acme"))
    view = _view(store)
    await view.check()
    calls = store.calls
    for _ in range(1000):
        identity = view.identity(HASH)
    assert identity is not None and identity.tenant == "acme" and store.calls == calls
    await store.aclose()


async def test_a_rotated_keys_old_hash_expires_with_its_grace() -> None:
    store = SqliteKeyStore(None)
    view = _view(store)
    await view.check()
    old = "sha256:" + "cd" * 32
    view.apply([KeyRecord("k1", HASH, "acme", previous_hash=old, previous_until=T0 + 1)])
    assert view.identity(old) is not None
    entry = view.entry(old)
    assert entry is not None and entry.valid_until == T0 + 1
    current = view.entry(HASH)
    assert current is not None and current.valid_until == math.inf
    view.apply([KeyRecord("k1", HASH, "acme", revoked_at=T0)])
    assert view.identity(old) is None and view.identity(HASH) is None


async def test_before_the_first_load_an_unknown_key_fails_closed() -> None:
    view = _view(SqliteKeyStore(None))
    with pytest.raises(KeysUnavailable):
        view.identity(HASH)
    open_view = _view(SqliteKeyStore(None), on_store_error="fail_open")
    assert open_view.identity(HASH) is None
