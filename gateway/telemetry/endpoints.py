"""`GET /metrics`: the Prometheus exposition of `GatewayMetrics`."""

from __future__ import annotations

from aiohttp import web

from gateway.telemetry.metrics import GatewayMetrics


def metrics_route(metrics: GatewayMetrics, path: str = "/metrics") -> web.RouteDef:
    async def exposition(request: web.Request) -> web.Response:
        # Rendered on the loop's thread, the one that updates the series (no locks).
        body, content_type = metrics.render()
        response = web.Response(body=body)
        # The exposition content type carries `version=` and `charset=`: set it verbatim.
        response.headers["Content-Type"] = content_type
        return response

    return web.get(path, exposition)
