"""The response cache in the app: its store (chosen once, at start-up) as `hooks.cache`,
its metrics on `/metrics`, closed at shutdown."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from gateway.blob_store import BlobStore, open_blobs
from gateway.cache.metrics import CacheCollector
from gateway.cache.response_cache import ResponseCache
from gateway.hooks import Hooks
from gateway.policy.live import LivePolicy

RESPONSE_CACHE = web.AppKey("routegate.response_cache", ResponseCache)


def install(app: web.Application, live: LivePolicy, hooks: Hooks, *,
            store: BlobStore | None = None) -> ResponseCache:
    settings = live.current.file.response_cache
    cache = ResponseCache(store or open_blobs(settings.store, settings.max_memory_bytes))
    live.pin("response_cache.store", lambda policy: policy.file.response_cache.store)
    hooks.cache = cache
    hooks.telemetry.metrics.registry.register(CacheCollector(cache))
    app[RESPONSE_CACHE] = cache
    app.cleanup_ctx.append(_close)
    return cache


async def _close(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[RESPONSE_CACHE].blobs.aclose()
