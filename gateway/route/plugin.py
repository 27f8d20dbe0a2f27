"""Routing as a plug-in: the router and its statistics, backend load and health checks,
`GET /admin/backends`."""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway.plugin import Provides, Wiring
from gateway.route.admin import install as install_backends_admin
from gateway.route.health import install as install_backend_health
from gateway.route.hook import ROUTING, RoutingHook
from gateway.route.load import install as install_load_poller
from gateway.route.replica_watch import install as install_fleets


def install(wiring: Wiring) -> Provides:
    """Routing as the pipeline's router and an observer (live statistics), its in-flight
    counter around whichever queue is installed; dedicated backends' own `/metrics`
    polled for their load, active health checks, `GET /admin/backends`, and the replicas
    of dedicated backends' fleets."""
    app, live, pool = wiring.app, wiring.live, wiring.pool
    hook = RoutingHook(wiring.stats, wiring.tokens)
    hook.metrics = wiring.metrics
    app[ROUTING] = hook
    pool.on_capabilities = hook.backend_reported  # what a launched backend can do

    async def load_tokenizer(_: web.Application) -> None:
        # Load the BPE tables now, off the loop, not inside the first request.
        await asyncio.to_thread(hook.tokens.encoding_for, "")

    app.on_startup.append(load_tokenizer)
    install_load_poller(app, live, pool, hook.stats)
    install_backend_health(app, live, pool, hook.ejections)
    install_backends_admin(app, live, pool)
    # dedicated backends' replicas: picked per attempt (prefix, load), salted, watched
    replicas = install_fleets(app, live, hook, wiring.metrics)
    return Provides(router=hook, observers=(hook,), replicas=replicas,
                    wraps_queue=hook.counting)
