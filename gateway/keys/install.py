"""Managed keys in the app: the store the policy's `keys:` names, the view authentication
reads, the admission around the limits', the spend ledger, the audit log and the admin
routes. Chosen once at start-up (`keys:` is pinned: changing it needs a restart)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from gateway.keys.admin import SERVICE, add_routes
from gateway.keys.admission import KeyAdmission
from gateway.keys.audit import AuditLog
from gateway.keys.redis_store import RedisKeyStore
from gateway.keys.service import KeyService
from gateway.keys.spend import SpendLedger
from gateway.keys.sqlite_store import SqliteKeyStore
from gateway.keys.store import KeyStore, KeyStoreUnavailable
from gateway.keys.view import KeyView
from gateway.limits.http import LIMITER
from gateway.plugin import Provides, Wiring

log = logging.getLogger("routegate.keys")


def store_for(store: str, data_dir: Path | None, redis_url: str | None) -> KeyStore:
    """`ROUTEGATE_REDIS_URL` (passed in as `redis_url`) wins, as for the limits."""
    url = redis_url or (None if store == "embedded" else store)
    if url is not None:
        return RedisKeyStore(url)
    return SqliteKeyStore(None if data_dir is None else data_dir / "keys.sqlite3")


def install(wiring: Wiring, *, store: KeyStore | None = None) -> Provides:
    """After the limits (whose limiter counts a key's own windows and budgets): the keys'
    lookup for authentication, their admission around the limits'. Never in the private,
    unpersisted Redis `serve --workers` starts for its limits."""
    app, live, data_dir = wiring.app, wiring.live, wiring.settings.data_dir
    redis_url = None if os.environ.get("ROUTEGATE_REDIS_PRIVATE") else wiring.settings.redis_url
    limiter = app.get(LIMITER)
    if limiter is None:
        raise RuntimeError("the managed keys plug-in counts keys' limits with the limits "
                           "plug-in's limiter: list it after the limits in PLUGINS")
    settings = live.current.file.keys
    live.pin("keys", lambda policy: policy.file.keys)
    store = store or store_for(settings.store, data_dir, redis_url)
    view = KeyView(store, settings)
    ledger = SpendLedger(store)
    audit = AuditLog(None if data_dir is None else data_dir / "audit.log",
                     max_bytes=settings.audit_max_bytes, backups=settings.audit_backups,
                     registry=wiring.metrics.registry)
    service = KeyService(store, view, ledger, audit, live, limiter)
    app[SERVICE] = service
    add_routes(app)
    app.cleanup_ctx.append(_running)
    return Provides(managed_keys=view, wraps_admission=lambda inner: KeyAdmission(
        inner, limiter, view, ledger))


async def _running(app: web.Application) -> AsyncIterator[None]:
    service = app[SERVICE]
    try:  # keys work from the first request when the store is up; else the loop retries
        await service.view.check()
    except KeyStoreUnavailable as exc:
        log.warning("key store unavailable at start-up: %s", exc)
        service.view.failing = str(exc)
    tasks = [asyncio.create_task(service.view.run(), name="routegate.keys.view"),
             asyncio.create_task(service.ledger.run(), name="routegate.keys.spend")]
    yield
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    try:
        await service.ledger.flush()
    except KeyStoreUnavailable as exc:
        log.warning("spend of the last second not written: %s", exc)
    await service.store.aclose()
    service.audit.close()
