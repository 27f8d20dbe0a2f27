"""`GET /metrics`: the Prometheus exposition of `GatewayMetrics`."""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway.telemetry.metrics import GatewayMetrics


def metrics_route(metrics: GatewayMetrics, path: str = "/metrics") -> web.RouteDef:
    async def exposition(request: web.Request) -> web.Response:
        # Multi-process mode reads every worker's files: keep that off the event loop.
        if metrics.multiprocess_dir:
            body, content_type = await asyncio.to_thread(metrics.render)
        else:
            body, content_type = metrics.render()
        response = web.Response(body=body)
        # The exposition content type carries `version=` and `charset=`: set it verbatim.
        response.headers["Content-Type"] = content_type
        return response

    return web.get(path, exposition)
