"""Wiring telemetry into the aiohttp app: `/metrics`, `/dashboard`, flush at shutdown."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import AsyncIterator
from typing import TextIO

from aiohttp import web

from gateway.dashboard import dashboard_routes
from gateway.telemetry.access_log import LOGGER_NAME, json_line_handler
from gateway.telemetry.endpoints import metrics_route
from gateway.telemetry.service import Telemetry

TELEMETRY = web.AppKey("routegate.telemetry", Telemetry)


def install_telemetry(app: web.Application, telemetry: Telemetry) -> None:
    app[TELEMETRY] = telemetry
    app.router.add_routes([metrics_route(telemetry.metrics), *dashboard_routes(telemetry.live)])
    app.cleanup_ctx.append(_flush_at_shutdown)


async def _flush_at_shutdown(app: web.Application) -> AsyncIterator[None]:
    yield
    # The exporter may block on the network (bounded by its own timeout): not on the loop.
    await asyncio.to_thread(app[TELEMETRY].shutdown)


def configure_access_log(stream: TextIO | None = None) -> None:
    """Entry point only: access lines go out bare (one JSON object per line), unprefixed."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(json_line_handler(stream or sys.stdout))
