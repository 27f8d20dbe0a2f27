"""A task that runs for the app's lifetime, owned by `app.cleanup_ctx`, and what such a
task sleeps on between its due times."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from aiohttp import web


def run_while_serving(app: web.Application, name: str,
                      run: Callable[[], Coroutine[Any, Any, object]]) -> None:
    """Start `run()` as the app starts; cancel it, and wait for it to end, as it stops."""

    async def lifetime(_: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(run(), name=name)
        yield
        task.cancel()
        await asyncio.wait([task])  # waits for it to end without taking its CancelledError

    app.cleanup_ctx.append(lifetime)


class Wakeup:
    """What a background loop sleeps on between its due times: `wait` ends when the
    time is up or, sooner, when something the loop reads changed (`set`)."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, timeout_s: float) -> None:
        """At most `timeout_s` (`math.inf`: until `set`); a `set` that came while the
        loop was busy ends it at once."""
        event = self._event
        if not event.is_set() and timeout_s > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(None if timeout_s == math.inf else timeout_s):
                    await event.wait()
        event.clear()
