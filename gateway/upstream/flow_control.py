"""Waiting out a paused transport while a large request body is written to a backend
(`http1._write_with_flow_control`), or taking the backend's answer if it comes first."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import StreamReader

from gateway.compat.aiohttp import RawResponseMessage, ResponseHandler, drained


async def drained_or_answered(
        protocol: ResponseHandler) -> tuple[RawResponseMessage, StreamReader] | None:
    """Wait for the transport to drain; the backend's answer if it comes first."""
    draining = asyncio.ensure_future(drained(protocol))
    reading = asyncio.ensure_future(protocol.read())
    try:
        await asyncio.wait((draining, reading), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in (draining, reading):
            if not waiter.done():
                waiter.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await waiter
    if reading.done() and not reading.cancelled() and reading.exception() is None:
        return reading.result()
    if draining.done() and not draining.cancelled():
        with contextlib.suppress(ConnectionError):  # closed: `read()` says why, next
            draining.result()
    return None
