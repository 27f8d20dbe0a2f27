"""The queues in the app: the pipeline's slot hook, policy reloads, `GET /admin/queues`.

    GET /admin/queues   per queue: limit, in flight, waiting by priority, mean hold
                        time, predicted wait by priority, counters (admin key)
"""

from __future__ import annotations

import dataclasses

import orjson
from aiohttp import web

from gateway.auth import require_admin
from gateway.hooks import Hooks
from gateway.policy.live import LivePolicy
from gateway.queueing.queues import BackendQueues
from gateway.queueing.slot_hook import QueueSlotHook

QUEUES = web.AppKey("routegate.queues", BackendQueues)
_LIVE = web.AppKey("routegate.queueing.live", LivePolicy)


def install(app: web.Application, live: LivePolicy, hooks: Hooks, *,
            queues: BackendQueues | None = None, share: int = 1) -> BackendQueues:
    """Limits come from the policy (`backends.<name>.max_concurrency`) and follow reloads;
    `share`: how many gateway processes on this machine divide each limit."""
    queues = queues or BackendQueues(share=share)
    queues.apply_policy(live.current)
    live.on_swap(queues.apply_policy)
    hooks.queue = QueueSlotHook(queues)
    app[QUEUES] = queues
    app[_LIVE] = live
    app.router.add_get("/admin/queues", get_queues)
    return queues


async def get_queues(request: web.Request) -> web.Response:
    require_admin(request, request.app[_LIVE].current)
    body = {key: dataclasses.asdict(snapshot)
            for key, snapshot in request.app[QUEUES].snapshots().items()}
    return web.Response(body=orjson.dumps(body), content_type="application/json")
