"""The Batch API in the app: its routes, its own pipeline (the same steps, told about
batch lines), the spare-capacity gate over the app's queues and backend load, and the
task that runs this replica's batches, owned by `app.cleanup_ctx`."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from gateway.api.openai import CHAT, EMBEDDINGS
from gateway.api.responses import RESPONSES_STATE, ResponsesCall
from gateway.api.validate import check_chat
from gateway.batches.gate import SpareCapacity
from gateway.batches.http import BATCHES, add_routes
from gateway.batches.line_pipeline import BatchPipeline
from gateway.batches.metrics import BatchMetrics
from gateway.batches.service import BatchService
from gateway.core.context import Endpoint
from gateway.core.drain import DRAIN
from gateway.core.live_policy import LivePolicy
from gateway.plugin import Hooks
from gateway.queueing.http import QUEUES
from gateway.settings import default_data_dir
from gateway.telemetry.service import Telemetry
from gateway.upstream.pool import UpstreamPool
from routing.stats import LiveStats


def _data_dir(from_policy: str | None, process: Path | None) -> Path:
    """The policy's `batches.data_dir`, else the gateway's data directory (`serve` sets it
    from `ROUTEGATE_DATA_DIR`; the same default otherwise)."""
    if from_policy is not None:
        return Path(from_policy)
    return process if process is not None else default_data_dir(os.environ)


def install(app: web.Application, live: LivePolicy, pool: UpstreamPool, hooks: Hooks,
            stats: LiveStats, telemetry: Telemetry, *, data_dir: Path | None) -> BatchService:
    """After the plug-ins (the queues, routing's `stats`): lines run through a pipeline of
    their own over the same hooks."""
    settings = live.current.file.batches
    data_dir = _data_dir(settings.data_dir, data_dir)

    def responses() -> Endpoint:
        return Endpoint("responses", "/chat/completions", check_chat,
                        dialect=ResponsesCall(app[RESPONSES_STATE]))

    service = BatchService(
        data_dir=data_dir, store=settings.store,
        pipeline=BatchPipeline(live, pool, hooks, telemetry),
        gate=SpareCapacity(app[QUEUES], stats),
        endpoints={"/v1/chat/completions": lambda: CHAT, "/v1/embeddings": lambda: EMBEDDINGS,
                   "/v1/responses": responses},
        metrics=BatchMetrics(telemetry.metrics.registry),
        draining=lambda: app[DRAIN].draining)
    live.pin("batches.store", lambda policy: policy.file.batches.store)
    app[BATCHES] = service
    add_routes(app)
    app.cleanup_ctx.append(_running)
    app.on_shutdown.append(_stop)  # before any cleanup: the upstream pool is still open
    return service


async def _running(app: web.Application) -> AsyncIterator[None]:
    service = app[BATCHES]
    service.start()
    yield
    await service.aclose()


async def _stop(app: web.Application) -> None:
    await app[BATCHES].stop()
