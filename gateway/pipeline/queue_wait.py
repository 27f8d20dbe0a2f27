"""Holding a backend's queue slot for one attempt, with the wait for it recorded: a
traced step on the record, the queue-depth gauge, and the queue clock.

A class rather than `@asynccontextmanager`, which would build a generator per request.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from time import time_ns
from typing import Any

from gateway.core.record import ERROR_TEXT_CHARS, RequestRecord, StepRecord
from gateway.core.timing import RequestTimings, as_ms
from gateway.telemetry.metric_series import GaugeSeries

QUEUE_STEP = "routegate.queue.wait"


class QueuedSlot:
    """`async with QueuedSlot(record, timings, backend, depth, slot)`: `slot` held."""

    __slots__ = ("_backend", "_depth", "_record", "_slot", "_timings")

    def __init__(self, record: RequestRecord, timings: RequestTimings, backend: str,
                 depth: GaugeSeries, slot: AbstractAsyncContextManager[Any]) -> None:
        self._record, self._timings, self._backend = record, timings, backend
        self._depth, self._slot = depth, slot

    async def __aenter__(self) -> None:
        timings = self._timings
        step = StepRecord(QUEUE_STEP, time_ns(), backend=self._backend) \
            if self._record.sampled else None
        reported_before = timings.queue_s
        timings.queue_started()
        self._depth.inc()
        try:
            await self._slot.__aenter__()
        except BaseException as exc:
            self._waited(step, reported_before, exc)
            raise
        self._waited(step, reported_before, None)

    def _waited(self, step: StepRecord | None, reported_before: float,
                exc: BaseException | None) -> None:
        timings = self._timings
        self._depth.dec()
        reported = timings.queue_s != reported_before
        waited_s = timings.queue_ended()
        if reported:  # the queue's own figure wins; do not count the wait twice
            timings.queue_s -= waited_s
        if step is None:
            return
        step.end_ns = time_ns()
        step.waited_ms = as_ms(waited_s)
        if exc is not None:
            step.error_type = type(exc).__name__
            step.error_text = str(exc)[:ERROR_TEXT_CHARS]
        self._record.steps.append(step)

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        traceback: Any) -> bool | None:
        return await self._slot.__aexit__(kind, exc, traceback)
