"""Waiting for what the code under test does in the background: a condition polled
until it holds, within a bound generous enough for a loaded CI machine, instead of a
fixed sleep that is either too short there or needlessly long everywhere."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


async def until(condition: Callable[[], bool | Awaitable[bool]], timeout_s: float = 10.0,
                *, every_s: float = 0.01) -> float:
    """The seconds until `condition()` (a plain or async callable) held; `AssertionError`
    if it still does not after `timeout_s`."""
    started = time.monotonic()
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return time.monotonic() - started
        if time.monotonic() - started >= timeout_s:
            raise AssertionError(f"the condition did not hold within {timeout_s:g} s")
        await asyncio.sleep(every_s)
