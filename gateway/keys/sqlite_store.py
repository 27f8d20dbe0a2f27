"""The embedded key store: SQLite (standard library) in one file under the data directory.

Nothing is created until the first key is: a gateway that never issues one leaves no
file. Every call runs in a thread (SQLite blocks), on one connection guarded by a lock;
WAL mode lets the workers of `serve --workers N` read while one writes, and they see each
other's writes through the periodic check (SQLite has no notifications). Each write is
one transaction: a key is there whole or not at all.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TypeVar

from gateway.keys.record import KeyRecord
from gateway.keys.store import KeyExists, KeyStoreUnavailable, SpendRow

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL, record BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS keys_seq ON keys (seq);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS spend (
    day TEXT NOT NULL, tenant TEXT NOT NULL, key TEXT NOT NULL, model TEXT NOT NULL,
    route TEXT NOT NULL, backend TEXT NOT NULL,
    requests INTEGER NOT NULL, input_tokens INTEGER NOT NULL,
    output_tokens INTEGER NOT NULL, cost_micros INTEGER NOT NULL,
    PRIMARY KEY (day, tenant, key, model, route, backend));
CREATE TABLE IF NOT EXISTS key_totals (key TEXT PRIMARY KEY, cost_micros INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('seq', 0);
"""
BUSY_TIMEOUT_S = 2.0  # another worker's write: wait this long for the lock, then fail


class SqliteKeyStore:
    name = "embedded"

    def __init__(self, path: Path | None) -> None:
        """`path` None: a database in memory, for this process alone (an app built
        without a data directory, as tests build it)."""
        self.path = path
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    def _connection(self, *, create: bool) -> sqlite3.Connection | None:
        if self._db is None:
            path = self.path
            if path is not None and not create and not path.exists():
                return None
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(":memory:" if path is None else path, timeout=BUSY_TIMEOUT_S,
                                 check_same_thread=False, isolation_level=None)
            if path is not None:
                db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
            self._db = db
        return self._db

    async def _run(self, work: Callable[[sqlite3.Connection], T], empty: T, *,
                   create: bool = False) -> T:
        def locked() -> T:
            with self._lock:
                db = self._connection(create=create)
                return empty if db is None else work(db)
        try:
            return await asyncio.to_thread(locked)
        except sqlite3.Error as exc:
            raise KeyStoreUnavailable(f"sqlite: {exc}") from exc

    async def snapshot(self) -> tuple[list[KeyRecord], int]:
        def read(db: sqlite3.Connection) -> tuple[list[KeyRecord], int]:
            db.execute("BEGIN")
            try:
                rows = db.execute("SELECT record FROM keys").fetchall()
                return [KeyRecord.from_json(row[0]) for row in rows], _seq(db)
            finally:
                db.execute("COMMIT")
        return await self._run(read, ([], 0))

    async def sequence(self) -> int:
        return await self._run(_seq, 0)

    async def changes_since(self, sequence: int) -> tuple[list[KeyRecord], int]:
        def read(db: sqlite3.Connection) -> tuple[list[KeyRecord], int]:
            db.execute("BEGIN")
            try:
                rows = db.execute("SELECT record FROM keys WHERE seq > ?",
                                  (sequence,)).fetchall()
                return [KeyRecord.from_json(row[0]) for row in rows], _seq(db)
            finally:
                db.execute("COMMIT")
        return await self._run(read, ([], sequence))

    async def get(self, key_id: str) -> KeyRecord | None:
        def read(db: sqlite3.Connection) -> KeyRecord | None:
            row = db.execute("SELECT record FROM keys WHERE id = ?", (key_id,)).fetchone()
            return None if row is None else KeyRecord.from_json(row[0])
        return await self._run(read, None)

    async def create(self, record: KeyRecord) -> int:
        return await self._write(record, create=True)

    async def put(self, record: KeyRecord) -> int:
        return await self._write(record, create=False)

    async def _write(self, record: KeyRecord, *, create: bool) -> int:
        def write(db: sqlite3.Connection) -> int:
            db.execute("BEGIN IMMEDIATE")
            try:
                exists = db.execute("SELECT 1 FROM keys WHERE id = ?",
                                    (record.id,)).fetchone() is not None
                if create and exists:
                    raise KeyExists(record.id)
                seq = db.execute("UPDATE meta SET value = value + 1 WHERE name = 'seq' "
                                 "RETURNING value").fetchone()[0]
                db.execute("INSERT OR REPLACE INTO keys VALUES (?, ?, ?)",
                           (record.id, seq, record.to_json()))
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return int(seq)
        return await self._run(write, 0, create=True)

    def notifications(self) -> AsyncIterator[str] | None:
        return None

    async def add_spend(self, rows: Sequence[SpendRow]) -> None:
        def write(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "INSERT INTO spend VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT DO UPDATE SET requests = requests + excluded.requests, "
                    "input_tokens = input_tokens + excluded.input_tokens, "
                    "output_tokens = output_tokens + excluded.output_tokens, "
                    "cost_micros = cost_micros + excluded.cost_micros",
                    [(*row.dimensions, row.requests, row.input_tokens, row.output_tokens,
                      row.cost_micros) for row in rows])
                db.executemany(
                    "INSERT INTO key_totals VALUES (?, ?) ON CONFLICT DO UPDATE SET "
                    "cost_micros = cost_micros + excluded.cost_micros",
                    [(row.key, row.cost_micros) for row in rows if row.key])
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        if rows:
            await self._run(write, None, create=True)

    async def spend(self, first_day: str, last_day: str) -> list[SpendRow]:
        def read(db: sqlite3.Connection) -> list[SpendRow]:
            rows = db.execute("SELECT * FROM spend WHERE day BETWEEN ? AND ?",
                              (first_day, last_day)).fetchall()
            return [SpendRow(*row) for row in rows]
        return await self._run(read, [])

    async def key_total_micros(self, key_ids: Sequence[str]) -> dict[str, int]:
        def read(db: sqlite3.Connection) -> dict[str, int]:
            marks = ",".join("?" * len(key_ids))
            rows = db.execute(f"SELECT key, cost_micros FROM key_totals WHERE key IN ({marks})",
                              tuple(key_ids)).fetchall()
            return {key: int(micros) for key, micros in rows}
        return await self._run(read, {}) if key_ids else {}

    async def aclose(self) -> None:
        def close() -> None:
            with self._lock:
                if self._db is not None:
                    self._db.close()
                    self._db = None
        await asyncio.to_thread(close)


def _seq(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT value FROM meta WHERE name = 'seq'").fetchone()[0])
