"""The queues in the app: the pipeline's slot hook, policy reloads, `GET /admin/queues`.

    GET /admin/queues   per queue: limit, in flight (of which background), waiting by
                        priority, mean hold time, predicted wait by priority,
                        counters (admin key)
"""

from __future__ import annotations

import dataclasses

import orjson
from aiohttp import web

from gateway.core.auth import require_admin
from gateway.core.live_policy import LivePolicy
from gateway.plugin import Provides, Wiring
from gateway.queueing.queues import BackendQueues
from gateway.queueing.slot_hook import QueueSlotHook

QUEUES = web.AppKey("routegate.queues", BackendQueues)
_LIVE = web.AppKey("routegate.queueing.live", LivePolicy)


def install(wiring: Wiring, *, queues: BackendQueues | None = None) -> Provides:
    """Limits come from the policy (`backends.<name>.max_concurrency`) and follow reloads,
    shared out among the gateway processes on this machine (`serve --workers`)."""
    app, live = wiring.app, wiring.live
    queues = queues or BackendQueues(share=wiring.settings.workers)
    queues.apply_policy(live.current)
    live.on_swap(queues.apply_policy)
    app[QUEUES] = queues
    app[_LIVE] = live
    app.router.add_get("/admin/queues", get_queues)
    return Provides(queue=QueueSlotHook(queues))


async def get_queues(request: web.Request) -> web.Response:
    require_admin(request, request.app[_LIVE].current)
    body = {key: dataclasses.asdict(snapshot)
            for key, snapshot in request.app[QUEUES].snapshots().items()}
    return web.Response(body=orjson.dumps(body), content_type="application/json")
