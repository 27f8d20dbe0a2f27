"""Waiting out a paused transport while a large request body is written to a backend
(`write_with_flow_control`), or taking the backend's answer if it comes first."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from aiohttp import ServerTimeoutError, StreamReader

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


# Slices, not one write: one write is copied whole into the transport's buffer (TLS: into
# the socket transport's under it, never pausing the TLS one), so only slices keep the
# buffer bounded.
WRITE_SLICE_BYTES = 64 * 1024  # asyncio's high-water mark for a socket transport


async def write_with_flow_control(
        protocol: ResponseHandler, body: bytes, expired: Callable[[], bool],
) -> tuple[RawResponseMessage, StreamReader] | None:
    """Write `body` a slice at a time; whenever the transport pauses writing (its buffer
    over the high-water mark), wait until it drains, as aiohttp's own writer does
    (`compat.aiohttp.drained`) — or until the backend answers without reading the
    rest (a 413, say, on a connection it keeps open): that answer is returned, and the
    connection, half a body behind, is not used again. `total_s` ends a wait
    (`expired()`): `Http1Response._expire` aborts the connection, which wakes it."""
    view = memoryview(body)
    for start in range(0, len(view), WRITE_SLICE_BYTES):
        transport = protocol.transport
        if transport is None or transport.is_closing():  # (uvloop's write would raise)
            # Closed by the backend: `read()` gives its answer (one sent before it
            # stopped reading) or says why there is none.
            return None
        transport.write(view[start:start + WRITE_SLICE_BYTES])
        while protocol.writing_paused:
            answered = await drained_or_answered(protocol)
            if expired():  # `total_s` is up: `Http1Response._expire` finished it meanwhile
                raise ServerTimeoutError("Total timeout: the backend did not read the "
                                         "request body in time")
            if answered is None:
                break
            if not 100 <= answered[0].code < 200 or answered[0].code == 101:
                protocol.force_close()
                return answered
            # an interim 100 Continue while the body goes out: keep writing
    return None
