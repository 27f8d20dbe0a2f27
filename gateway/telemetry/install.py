"""Wiring telemetry into the aiohttp app: `/metrics`, `/dashboard`, flush at shutdown."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from gateway.core.live_policy import LivePolicy
from gateway.telemetry.endpoints import metrics_route
from gateway.telemetry.service import Telemetry

TELEMETRY = web.AppKey("routegate.telemetry", Telemetry)


def install_telemetry(app: web.Application, telemetry: Telemetry,
                      policy: LivePolicy | None = None) -> None:
    app[TELEMETRY] = telemetry
    app.router.add_routes([metrics_route(telemetry.metrics, policy=policy)])
    app.cleanup_ctx.append(_flush_at_shutdown)


ACCESS_LOG_FLUSH_S = 1.0  # a buffered access line reaches its stream within this
# (and the trace export's drop count reaches `/metrics` within this)


async def _flush_at_shutdown(app: web.Application) -> AsyncIterator[None]:
    telemetry = app[TELEMETRY]
    flusher = asyncio.create_task(_every_second(telemetry))
    yield
    flusher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await flusher
    # The exporter may block on the network (bounded by its own timeout): not on the loop.
    await asyncio.to_thread(telemetry.shutdown)


async def _every_second(telemetry: Telemetry) -> None:
    while True:
        await asyncio.sleep(ACCESS_LOG_FLUSH_S)
        telemetry.access_log.flush()
        telemetry.metrics.observe_dropped_spans(telemetry.dropped_spans())
