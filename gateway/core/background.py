"""A task that runs for the app's lifetime, owned by `app.cleanup_ctx`."""

from __future__ import annotations

import asyncio
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
