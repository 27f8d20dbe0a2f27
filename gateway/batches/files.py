"""Uploaded and produced files: bytes under `<data_dir>/files/`, metadata in the batch
state (so every replica sharing the directory and the state sees the same files).

An upload is checked before it is kept: its size, its number of lines and the length of
each, with a 400 that names the first line past a limit. Whether each line is a valid
request is the batch's business: a malformed line becomes an error record when the
batch runs, never a lost one."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from gateway.batches.model import FileObject, new_id
from gateway.batches.state import BatchState
from gateway.core.errors import BadRequest, NotFound, PayloadTooLarge
from policies.batch_schema import Batches

PURPOSES = ("batch",)


def count_lines(data: bytes, settings: Batches) -> int:
    """The JSONL file's lines (blank ones not counted); a 400 naming the first line over
    `max_line_bytes` or past `max_lines`."""
    count = 0
    for number, line in enumerate(data.split(b"\n"), start=1):
        if len(line) > settings.max_line_bytes:
            raise BadRequest(f"Line {number} of the file is {len(line)} bytes, over the limit "
                             f"of {settings.max_line_bytes} (batches.max_line_bytes).",
                             param="file", code="line_too_long")
        if line.strip():
            count += 1
            if count > settings.max_lines:
                raise BadRequest(f"Line {number} is past the limit of {settings.max_lines} "
                                 "lines a batch file may hold (batches.max_lines).",
                                 param="file", code="too_many_lines")
    if count == 0:
        raise BadRequest("The file holds no lines; a batch file has one request per line.",
                         param="file", code="empty_file")
    return count


SWEEP_BATCH = 100  # expired files deleted per sweep (the next poll takes the rest)
# `expires_after.seconds`, as OpenAI bounds it: an hour to 30 days
MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 30 * 24 * 3600


def expiry_s(value: object, param: str) -> int | None:
    """`{"anchor": "created_at", "seconds": N}` (OpenAI's `expires_after`) → N; None
    when absent. A 400 naming `param` otherwise."""
    if value is None:
        return None
    anchor = value.get("anchor") if isinstance(value, dict) else None
    seconds = value.get("seconds") if isinstance(value, dict) else None
    if isinstance(seconds, str) and seconds.isdigit():
        seconds = int(seconds)  # a multipart form sends it as text
    if anchor != "created_at" or not isinstance(seconds, int) or isinstance(seconds, bool) \
            or not MIN_EXPIRY_S <= seconds <= MAX_EXPIRY_S:
        raise BadRequest(f"{param} must be {{\"anchor\": \"created_at\", \"seconds\": N}} with "
                         f"N from {MIN_EXPIRY_S} to {MAX_EXPIRY_S}; got {value!r}.",
                         param=param)
    return seconds


class FileStore:
    def __init__(self, data_dir: Path, state: BatchState) -> None:
        self.directory = data_dir / "files"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.state = state

    def path(self, file_id: str) -> Path:
        return self.directory / f"{file_id}.jsonl"

    async def upload(self, tenant: str, filename: str, purpose: str, data: bytes,
                     settings: Batches, expires_s: int | None = None) -> FileObject:
        if purpose not in PURPOSES:
            raise BadRequest(f"purpose must be one of {', '.join(PURPOSES)}; got {purpose!r}.",
                             param="purpose")
        if len(data) > settings.max_file_bytes:
            raise PayloadTooLarge(f"The file is {len(data)} bytes, over the limit of "
                                  f"{settings.max_file_bytes} (batches.max_file_bytes).")
        lines = count_lines(data, settings)
        return await self.keep(tenant, filename, purpose, data, lines, expires_s)

    async def keep(self, tenant: str, filename: str, purpose: str, data: bytes,
                   lines: int, expires_s: int | None = None) -> FileObject:
        now = int(time.time())
        file = FileObject(id=new_id("file"), bytes=len(data), created_at=now,
                          filename=filename, purpose=purpose, tenant=tenant, lines=lines,
                          expires_at=None if expires_s is None else now + expires_s)
        await asyncio.to_thread(_write_whole, self.path(file.id), data)
        await self.state.put_file(file)
        return file

    async def get(self, tenant: str, file_id: str) -> FileObject:
        """The tenant's file, or 404 (another tenant's file is not found, not forbidden)."""
        file = await self.state.get_file(file_id)
        if file is None or file.tenant != tenant or file.expired(time.time()):
            raise NotFound(f"No file found with id '{file_id}'.", param="file_id")
        return file

    async def content(self, file: FileObject) -> bytes:
        return await asyncio.to_thread(self.path(file.id).read_bytes)

    async def delete(self, file: FileObject) -> None:
        await self.state.delete_file(file.id)
        await asyncio.to_thread(self.path(file.id).unlink, True)

    async def sweep(self, now: float, most: int = SWEEP_BATCH) -> int:
        """Delete up to `most` files whose time is up (every replica sweeps; a file
        deleted twice is deleted once); how many."""
        expired = await self.state.expired_files(now, most)
        for file in expired:
            await self.delete(file)
        return len(expired)


def _write_whole(path: Path, data: bytes) -> None:
    """Written aside and renamed: a reader on another replica sees all of it or none."""
    partial = path.with_suffix(".partial")
    with open(partial, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    partial.replace(path)
