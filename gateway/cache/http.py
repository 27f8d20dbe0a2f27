"""The response cache in the app: its store (chosen once, at start-up) as `hooks.cache`,
its metrics on `/metrics`, closed at shutdown."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from gateway.cache.metrics import CacheCollector
from gateway.cache.response_cache import ResponseCache
from gateway.plugin import Provides, Wiring
from gateway.stores.blobs import BlobStore, open_blobs

RESPONSE_CACHE = web.AppKey("routegate.response_cache", ResponseCache)


def install(wiring: Wiring, *, store: BlobStore | None = None) -> Provides:
    app, live = wiring.app, wiring.live
    settings = live.current.file.response_cache
    cache = ResponseCache(store or open_blobs(settings.store, settings.max_memory_bytes))
    live.pin("response_cache.store", lambda policy: policy.file.response_cache.store)
    wiring.metrics.registry.register(CacheCollector(cache))
    app[RESPONSE_CACHE] = cache
    app.cleanup_ctx.append(_close)
    return Provides(cache=cache)


async def _close(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[RESPONSE_CACHE].blobs.aclose()
