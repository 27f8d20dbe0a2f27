"""The queue wait of one request, traced: span, queue-depth gauge and the clock.

Classes rather than `@asynccontextmanager`, which would build a generator per request.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Span

from gateway.telemetry.record_span import give_facts
from gateway.telemetry.span_facts import QUEUE
from gateway.telemetry.spans import mark_error

if TYPE_CHECKING:
    from gateway.telemetry.request import RequestTelemetry


class QueueWait:
    """The queue wait as a class, not @asynccontextmanager (a generator per request)."""

    __slots__ = ("_backend", "_gauge", "_reported_before", "_tel", "span")

    def __init__(self, tel: RequestTelemetry, backend: str) -> None:
        self._tel, self._backend = tel, backend

    def begin(self) -> Span:
        tel = self._tel
        self._gauge = tel.metrics.queue_depth_of(self._backend)
        self.span = tel.trace.start("routegate.queue.wait")
        self._reported_before = tel.timings.queue_s
        tel.timings.queue_started()
        self._gauge.inc()
        return self.span

    def end(self, exc: BaseException | None) -> None:
        timings, span = self._tel.timings, self.span
        if exc is not None:
            mark_error(span, exc)
        self._gauge.dec()
        reported = timings.queue_s != self._reported_before
        waited_s = timings.queue_ended()
        if reported:  # the queue's own figure wins; do not count the wait twice
            timings.queue_s -= waited_s
        if span.is_recording():
            give_facts(span, (QUEUE, self._backend, round(waited_s * 1000.0, 3)))
        span.end()

    async def __aenter__(self) -> Span:
        return self.begin()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        traceback: object) -> None:
        self.end(exc)


class Queued:
    """`async with tel.queued(backend, slot)`: the slot held, the wait for it traced."""

    __slots__ = ("_slot", "_wait")

    def __init__(self, tel: RequestTelemetry, backend: str,
                 slot: AbstractAsyncContextManager[Any]) -> None:
        self._wait = QueueWait(tel, backend)
        self._slot = slot

    async def __aenter__(self) -> None:
        self._wait.begin()
        try:
            await self._slot.__aenter__()
        except BaseException as exc:
            self._wait.end(exc)
            raise
        self._wait.end(None)

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        traceback: Any) -> bool | None:
        return await self._slot.__aexit__(kind, exc, traceback)
