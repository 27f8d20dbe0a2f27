"""`precise` prefix picking: the index follows what each `local_backend` replica holds.

With `fleet.prefix.precise`, every request to a replica carries `PREFIX_HEADER` (the
backend's `block_chars`), so the replica names the prompt's blocks exactly as the
gateway does (`routing.prefix_index.block_hashes`, seeded by the same `cache_salt`) and
logs each name as stored once its KV blocks are cached and as evicted the moment one of
them leaves. The watcher reads that log on every poll (`GET /v1/prefix_events`) and
applies it to the backend's index: the index then holds what replicas hold, not what
they were sent. A replica that restarted, or whose log moved on past the last read,
answers with a reset and everything it holds; the index forgets it and takes that.

The gateway still records a prompt on the replica it sends it to, at once (so a second
request a moment later finds it), and the log corrects that within a poll if the
replica could not keep it.
"""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import orjson

from gateway.route.replicas import Fleet, Replica

log = logging.getLogger("routegate.replicas")

PREFIX_HEADER = "x-routegate-prefix-blocks"
MAX_EVENTS_BYTES = 4 * 1024 * 1024  # 10,000 events a read, ~25 bytes each, and a reset's list


def events_url(replica_url: str) -> str:
    return replica_url.rstrip("/") + "/prefix_events"


async def follow(session: aiohttp.ClientSession, fleet: Fleet, replica: Replica,
                 read_timeout: aiohttp.ClientTimeout) -> None:
    """Read the replica's prefix events since the last read into the fleet's index. A
    failed or malformed read changes nothing (the next poll asks again)."""
    params = {"after": str(replica.events_next)}
    if replica.events_epoch is not None:
        params["epoch"] = replica.events_epoch
    try:
        async with session.get(events_url(replica.url), params=params, timeout=read_timeout,
                               allow_redirects=False) as response:
            if response.status != 200:
                return
            page = orjson.loads(await response.content.read(MAX_EVENTS_BYTES))
    except (TimeoutError, aiohttp.ClientError, OSError, orjson.JSONDecodeError):
        return
    if not apply(fleet, replica, page):
        log.warning("backend %s: replica %s sent a malformed prefix-event page",
                    fleet.name, replica.name)


def apply(fleet: Fleet, replica: Replica, page: Any) -> bool:
    """One page of the log into the index; False (and nothing applied) if malformed."""
    if not isinstance(page, dict):
        return False
    epoch, after, events = page.get("epoch"), page.get("next"), page.get("events")
    held = page.get("held") if page.get("reset") is True else None
    if (not isinstance(epoch, str) or not isinstance(after, int) or isinstance(after, bool)
            or not isinstance(events, list) or not isinstance(held, list | None)):
        return False
    try:
        changes = [(bool(stored), int(tag, 16)) for stored, tag in events]
        resets = None if held is None else [int(tag, 16) for tag in held]
    except (TypeError, ValueError):
        return False
    index = fleet.index
    if resets is not None:
        index.forget(replica.name)
        index.record(resets, replica.name)
    for stored, tag in changes:
        if stored:
            index.record((tag,), replica.name)
        else:
            index.evicted((tag,), replica.name)
    replica.events_epoch, replica.events_next = epoch, after
    return True
