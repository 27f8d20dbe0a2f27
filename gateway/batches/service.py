"""The batches of this replica: looks for batches no one runs, takes their lease and
runs them (each in its own task, owned by one TaskGroup), and releases what it holds
when the gateway stops, so another replica takes over at once rather than after the
lease lapses."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.batches.files import FileStore
from gateway.batches.gate import SpareCapacity
from gateway.batches.line_pipeline import BatchPipeline
from gateway.batches.metrics import BatchMetrics
from gateway.batches.redis_state import RedisState
from gateway.batches.runner import BatchRun, LeaseLost
from gateway.batches.state import BatchState, SqliteState
from gateway.core.context import Endpoint

log = logging.getLogger("routegate.batches")

MAX_RUN_FAILURES = 3  # runs of one batch that raised, in a row, before it is failed


class BatchService:
    def __init__(self, *, data_dir: Path, store: str, pipeline: BatchPipeline,
                 gate: SpareCapacity, endpoints: dict[str, Callable[[], Endpoint]],
                 metrics: BatchMetrics, draining: Callable[[], bool]) -> None:
        self.data_dir, self.store = data_dir, store
        self.pipeline, self.gate, self.metrics = pipeline, gate, metrics
        self.draining = draining  # stop taking batches and sending lines; hand them over
        self._state: BatchState | None = None
        self._files: FileStore | None = None
        self._task: asyncio.Task[None] | None = None
        self.endpoints = endpoints  # "/v1/chat/completions" → a fresh Endpoint per line
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.running: dict[str, BatchRun | None] = {}  # None: its run is starting
        self.failures: dict[str, int] = {}  # batch id → its runs that failed in a row here
        self.wake = asyncio.Event()  # a batch was created here: look now

    @property
    def state(self) -> BatchState:
        """Opened on first use: a gateway no one sends batches to makes no files."""
        if self._state is None:
            self._state = (SqliteState(self.data_dir / "batches.sqlite3")
                           if self.store == "sqlite" else RedisState(self.store))
        return self._state

    @property
    def files(self) -> FileStore:
        if self._files is None:
            self._files = FileStore(self.data_dir, self.state)
        return self._files

    def has_state(self) -> bool:
        """Whether there can be batches to run (an embedded store not yet made has none)."""
        return self._state is not None or self.store != "sqlite" or \
            (self.data_dir / "batches.sqlite3").exists()

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="routegate.batches")

    async def stop(self) -> None:
        """Stop running batches (lines in flight are cancelled and run again by whoever
        takes the batch); before the upstream pool closes, so no line fails for that."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def aclose(self) -> None:
        await self.stop()
        if self._state is not None:
            await self._state.aclose()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            while True:
                try:
                    await self._claim(group)
                    if self.has_state():
                        await self.files.sweep(time.time())
                except Exception:  # a task supervisor: the store may be away for a while
                    log.exception("looking for batches to run failed; trying again")
                settings = self.pipeline.live.current.file.batches
                # asyncio.timeout, not wait_for: 3.11's wait_for can lose a cancellation
                # that arrives as its timeout fires, and the task would never stop
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(settings.poll_interval_s):
                        await self.wake.wait()
                self.wake.clear()

    async def _claim(self, group: asyncio.TaskGroup) -> None:
        if not self.has_state() or self.draining():
            return
        lease_s = self.pipeline.live.current.file.batches.lease_s
        for batch_id in await self.state.unfinished():
            if batch_id in self.running:
                continue
            if await self.state.acquire(batch_id, self.holder, lease_s):
                self.running[batch_id] = None
                group.create_task(self._run_one(batch_id))

    def dashboard(self) -> dict[str, dict[str, Any]]:
        """The batches this replica runs now, for the dashboard: progress, and where
        their lines ran and what they cost (micro-dollars)."""
        shown = {}
        for run in self.running.values():
            if run is None:
                continue
            batch, report = run.batch, run.batch.report
            shown[batch.id] = {
                "status": batch.status, "total": batch.total,
                "done": batch.completed + batch.failed,
                "dedicated_lines": report.dedicated.lines, "shared_lines": report.shared.lines,
                "cost_micros": report.cost_micros,
                "all_shared_cost_micros": report.all_shared_cost_micros}
        return shown

    async def _give_up(self, batch_id: str) -> None:
        """A batch whose runs keep failing (not a line: each line's failure is its own
        error record) is failed rather than retried forever."""
        try:
            batch = await self.state.get(batch_id)
            if batch is None or batch.final:
                return
            batch.status = "failed"
            batch.errors = [{"code": "internal_error", "param": None, "line": None,
                             "message": f"The gateway failed to run this batch "
                                        f"{MAX_RUN_FAILURES} times; its logs say why."}]
            batch.times["failed_at"] = int(time.time())
            await self.state.save(batch)
            self.failures.pop(batch_id, None)
        except Exception:  # the store is away: tried again on the next failure
            log.exception("batch %s: could not be marked failed", batch_id)

    async def _run_one(self, batch_id: str) -> None:
        lost = False
        try:
            batch = await self.state.get(batch_id)
            if batch is None or batch.final:
                return
            log.info("batch %s: running here (%s)", batch_id, self.holder)
            run = self.running[batch_id] = BatchRun(
                batch, state=self.state, files=self.files, pipeline=self.pipeline,
                gate=self.gate, endpoint=self.endpoints[batch.endpoint], holder=self.holder,
                metrics=self.metrics, stopping=self.draining)
            await run.run()
        except* LeaseLost:
            lost = True
            log.warning("batch %s: lease lost to another replica; stopped here", batch_id)
        except* Exception:  # a task supervisor: the batch is taken up again, a few times
            log.exception("batch %s: its run failed", batch_id)
            self.failures[batch_id] = failures = self.failures.get(batch_id, 0) + 1
            if failures >= MAX_RUN_FAILURES:
                await self._give_up(batch_id)
        else:
            self.failures.pop(batch_id, None)
        finally:
            self.running.pop(batch_id, None)
            if not lost:
                try:
                    await asyncio.shield(self.state.release(batch_id, self.holder))
                except Exception:  # the store is away: the lease lapses by itself
                    log.warning("batch %s: could not release its lease", batch_id)
