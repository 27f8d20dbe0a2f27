"""Batch state: what every replica must agree on (batches, files' metadata, each line's
result, who runs a batch now). `SqliteState` is the embedded default, a file in the data
directory shared by this machine's processes; `gateway.batches.redis_state` shares it
between replicas.

The lease makes one runner per batch: a holder renews it well inside `lease_s`; when a
holder dies its lease lapses and another replica takes the batch over, skipping every
line whose result is already stored."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

import orjson

from gateway.batches.model import Batch, FileObject, LineResult

T = TypeVar("T")


class BatchState(Protocol):
    async def put_file(self, file: FileObject) -> None: ...
    async def get_file(self, file_id: str) -> FileObject | None: ...
    async def delete_file(self, file_id: str) -> bool: ...
    async def file_listing(self, tenant: str, purpose: str | None, after: str | None,
                           limit: int, newest_first: bool, now: float) -> list[FileObject]:
        """The tenant's files of `purpose` (None: any) not expired at `now`, in upload
        order, from the one after `after` (a file id; one unknown to the tenant: none)."""
        ...
    async def expired_files(self, now: float, limit: int) -> list[FileObject]:
        """Up to `limit` files whose `expires_at` has passed at `now`."""
        ...
    async def create(self, batch: Batch) -> None: ...
    async def get(self, batch_id: str) -> Batch | None: ...
    async def save(self, batch: Batch) -> None:
        """Everything but the cancel request, which only `request_cancel` writes."""
        ...
    async def listing(self, tenant: str, after: str | None, limit: int) -> list[Batch]: ...
    async def request_cancel(self, batch_id: str, at: int) -> None: ...
    async def cancel_requested(self, batch_id: str) -> int | None: ...
    async def unfinished(self) -> list[str]: ...
    async def put_result(self, batch_id: str, result: LineResult) -> None: ...
    async def results(self, batch_id: str) -> dict[int, LineResult]: ...
    async def acquire(self, batch_id: str, holder: str, lease_s: float) -> bool:
        """Take or renew the batch's lease; False when another holder's is still live."""
        ...
    async def release(self, batch_id: str, holder: str) -> None: ...
    async def aclose(self) -> None: ...


def result_json(result: LineResult) -> bytes:
    return orjson.dumps({name: getattr(result, name) for name in LineResult.__slots__})


def result_of(data: bytes | str) -> LineResult:
    return LineResult(**orjson.loads(data))


_SCHEMA = """
-- files: tenant, created_at (with its fraction, as for batches), purpose and
-- expires_at are copies of fields in `data`, for the listing and the sweep
CREATE TABLE IF NOT EXISTS files (id TEXT PRIMARY KEY, data BLOB NOT NULL);
-- created_at: seconds with their fraction, for the listing's order (the batch's own
-- `created_at` is whole seconds, as OpenAI's)
CREATE TABLE IF NOT EXISTS batches (id TEXT PRIMARY KEY, tenant TEXT NOT NULL,
    created_at REAL NOT NULL, data BLOB NOT NULL, final INTEGER NOT NULL DEFAULT 0,
    cancel_at INTEGER, holder TEXT, lease_until REAL NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS batches_by_tenant ON batches (tenant, created_at);
CREATE TABLE IF NOT EXISTS results (batch_id TEXT NOT NULL, line INTEGER NOT NULL,
    data BLOB NOT NULL, PRIMARY KEY (batch_id, line));
"""


class SqliteState:
    """SQLite from the standard library, every call in a worker thread (the event loop
    never waits on the disk); WAL, so `serve --workers N` processes share one file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None,
                                   timeout=10.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        # WAL + NORMAL: a commit survives the process dying (what takeover relies on); only
        # an OS crash may lose the last commits, whose lines then simply run again
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        _add_file_columns(self._db)
        self._lock = threading.Lock()

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def locked() -> T:
            with self._lock:
                return work(self._db)
        return await asyncio.to_thread(locked)

    async def put_file(self, file: FileObject) -> None:
        data = orjson.dumps({name: getattr(file, name) for name in FileObject.__slots__})
        await self._run(lambda db: db.execute(
            "INSERT OR REPLACE INTO files (id, data, tenant, created_at, purpose, expires_at) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (file.id, data, file.tenant, time.time(), file.purpose, file.expires_at)))

    async def get_file(self, file_id: str) -> FileObject | None:
        row = await self._run(lambda db: db.execute(
            "SELECT data FROM files WHERE id = ?", (file_id,)).fetchone())
        return None if row is None else FileObject(**orjson.loads(row[0]))

    async def delete_file(self, file_id: str) -> bool:
        cursor = await self._run(lambda db: db.execute(
            "DELETE FROM files WHERE id = ?", (file_id,)))
        return cursor.rowcount > 0

    async def file_listing(self, tenant: str, purpose: str | None, after: str | None,
                           limit: int, newest_first: bool, now: float) -> list[FileObject]:
        order, beyond = ("DESC", "<") if newest_first else ("ASC", ">")
        where = ["tenant = ?", "(expires_at IS NULL OR expires_at > ?)"]
        args: list[object] = [tenant, now]
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        if after is not None:  # the cursor: the tenant's own file (else none: NULL)
            where.append(f"(created_at, id) {beyond} (SELECT created_at, id FROM files "
                         "WHERE id = ? AND tenant = ?)")
            args += [after, tenant]
        query = (f"SELECT data FROM files WHERE {' AND '.join(where)} "
                 f"ORDER BY created_at {order}, id {order} LIMIT ?")
        rows = await self._run(lambda db: db.execute(query, (*args, limit)).fetchall())
        return [FileObject(**orjson.loads(data)) for (data,) in rows]

    async def expired_files(self, now: float, limit: int) -> list[FileObject]:
        rows = await self._run(lambda db: db.execute(
            "SELECT data FROM files WHERE expires_at <= ? ORDER BY expires_at LIMIT ?",
            (now, limit)).fetchall())
        return [FileObject(**orjson.loads(data)) for (data,) in rows]

    async def create(self, batch: Batch) -> None:
        await self._run(lambda db: db.execute(
            "INSERT INTO batches (id, tenant, created_at, data) VALUES (?, ?, ?, ?)",
            (batch.id, batch.tenant, time.time(), orjson.dumps(batch.stored()))))

    async def get(self, batch_id: str) -> Batch | None:
        row = await self._run(lambda db: db.execute(
            "SELECT data, cancel_at FROM batches WHERE id = ?", (batch_id,)).fetchone())
        return None if row is None else _with_cancel(row[0], row[1])

    async def save(self, batch: Batch) -> None:
        await self._run(lambda db: db.execute(
            "UPDATE batches SET data = ?, final = ? WHERE id = ?",
            (orjson.dumps(batch.stored()), int(batch.final), batch.id)))

    async def listing(self, tenant: str, after: str | None, limit: int) -> list[Batch]:
        where, args = "tenant = ?", [tenant]
        if after is not None:  # the cursor: the tenant's own batch (else none: NULL)
            where += (" AND (created_at, id) < (SELECT created_at, id FROM batches "
                      "WHERE id = ? AND tenant = ?)")
            args += [after, tenant]
        rows = await self._run(lambda db: db.execute(
            f"SELECT data, cancel_at FROM batches WHERE {where} "
            "ORDER BY created_at DESC, id DESC LIMIT ?", (*args, limit)).fetchall())
        return [_with_cancel(data, cancel) for data, cancel in rows]

    async def request_cancel(self, batch_id: str, at: int) -> None:
        await self._run(lambda db: db.execute(
            "UPDATE batches SET cancel_at = COALESCE(cancel_at, ?) WHERE id = ?",
            (at, batch_id)))

    async def cancel_requested(self, batch_id: str) -> int | None:
        row = await self._run(lambda db: db.execute(
            "SELECT cancel_at FROM batches WHERE id = ?", (batch_id,)).fetchone())
        return None if row is None else row[0]

    async def unfinished(self) -> list[str]:
        rows = await self._run(lambda db: db.execute(
            "SELECT id FROM batches WHERE final = 0 ORDER BY created_at").fetchall())
        return [row[0] for row in rows]

    async def put_result(self, batch_id: str, result: LineResult) -> None:
        await self._run(lambda db: db.execute(
            "INSERT OR IGNORE INTO results VALUES (?, ?, ?)",
            (batch_id, result.index, result_json(result))))

    async def results(self, batch_id: str) -> dict[int, LineResult]:
        rows = await self._run(lambda db: db.execute(
            "SELECT data FROM results WHERE batch_id = ?", (batch_id,)).fetchall())
        found = [result_of(row[0]) for row in rows]
        return {result.index: result for result in found}

    async def acquire(self, batch_id: str, holder: str, lease_s: float) -> bool:
        def take(db: sqlite3.Connection) -> bool:
            now = time.time()
            cursor = db.execute(
                "UPDATE batches SET holder = ?, lease_until = ? WHERE id = ? AND final = 0 "
                "AND (holder IS NULL OR holder = ? OR lease_until < ?)",
                (holder, now + lease_s, batch_id, holder, now))
            return cursor.rowcount == 1
        return await self._run(take)

    async def release(self, batch_id: str, holder: str) -> None:
        await self._run(lambda db: db.execute(
            "UPDATE batches SET holder = NULL, lease_until = 0 WHERE id = ? AND holder = ?",
            (batch_id, holder)))

    async def aclose(self) -> None:
        await self._run(lambda db: db.close())


def _with_cancel(data: bytes, cancel_at: int | None) -> Batch:
    batch = Batch.from_stored(orjson.loads(data))
    return with_cancel(batch, cancel_at)


def with_cancel(batch: Batch, cancel_at: int | None) -> Batch:
    """A cancel asked for and not yet carried out shows as `cancelling`."""
    if cancel_at is not None and batch.status in ("validating", "in_progress"):
        batch.status = "cancelling"
        batch.times.setdefault("cancelling_at", cancel_at)
    return batch


def _add_file_columns(db: sqlite3.Connection) -> None:
    """The listing's and the sweep's columns, added to a state file from before them and
    filled in from each file's data (upload order then by whole seconds)."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(files)")}
    missing = [(name, kind) for name, kind in _FILE_COLUMNS if name not in columns]
    if missing:  # one transaction: every column, filled in, or none
        db.executescript("BEGIN;" + "".join(
            f"ALTER TABLE files ADD COLUMN {name} {kind};"
            f"UPDATE files SET {name} = json_extract(CAST(data AS TEXT), '$.{name}');"
            for name, kind in missing) + "COMMIT;")
    db.execute("CREATE INDEX IF NOT EXISTS files_by_tenant ON files (tenant, created_at)")
    db.execute("CREATE INDEX IF NOT EXISTS files_by_expiry ON files (expires_at)")


_FILE_COLUMNS = (("tenant", "TEXT NOT NULL DEFAULT ''"),
                 ("created_at", "REAL NOT NULL DEFAULT 0"),
                 ("purpose", "TEXT NOT NULL DEFAULT ''"),
                 ("expires_at", "INTEGER"))
