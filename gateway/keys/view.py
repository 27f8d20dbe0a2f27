"""A replica's in-memory view of the managed keys: what authentication reads.

Authentication never waits on the store: it is one dict lookup on the presented key's
hash and a constant-time compare, as for the policy file's keys. The view follows the
store by notifications (Redis pub/sub: a change is seen in milliseconds) and by a
periodic check of the store's sequence number (`keys.check_interval_s`), which also
catches what a lost notification missed. While the store cannot be reached the view is
unconfirmed: after `keys.max_stale_s` a revocation made meanwhile could be unseen, and
`keys.on_store_error` decides whether managed keys are then refused (503) or served as
last known.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar

from gateway.core.auth import Identity
from gateway.core.errors import GatewayError
from gateway.keys.record import KeyRecord
from gateway.keys.store import KeyStore, KeyStoreUnavailable
from policies.keys_schema import KeyService

log = logging.getLogger("routegate.keys")
RETRY = {"Retry-After": "1"}  # the view checks the store at least this often


class KeysUnavailable(GatewayError):
    status: ClassVar[int] = 503
    code: ClassVar[str | None] = "key_store_unavailable"
    type: ClassVar[str] = "server_error"
    retryable: ClassVar[bool] = True
    log_each: ClassVar[bool] = False  # the view logs the outage once


@dataclass(frozen=True, slots=True)
class ManagedKey:
    """One hash the view answers to: a key's current one, or the one a rotation replaced."""

    key_hash: str
    record: KeyRecord
    identity: Identity
    valid_until: float  # epoch seconds (math.inf: no expiry)


class KeyView:
    def __init__(self, store: KeyStore, settings: KeyService, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.settings = settings
        self._clock = clock
        self._by_hash: dict[str, ManagedKey] = {}
        self._hashes: dict[str, tuple[str, ...]] = {}  # key id → hashes it answers to
        self.records: dict[str, KeyRecord] = {}  # by id: every key, revoked ones too
        self.sequence = 0
        self.loaded = False
        self.confirmed_at: float | None = None  # time.monotonic() of the last good check
        self.failing: str | None = None  # the store's error while it is out
        self._dirty = asyncio.Event()

    # -- the hot path -------------------------------------------------------------------

    def identity(self, digest: str) -> Identity | None:
        """The caller a managed key stands for, None for a key the view does not hold
        (or holds revoked or expired); `KeysUnavailable` while an unconfirmed view may
        miss a revocation and `fail_closed` says to refuse."""
        entry = self._by_hash.get(digest)
        if entry is None:
            if not self.loaded and self._closed():
                raise KeysUnavailable("API keys cannot be checked right now (the key store "
                                      "is unavailable); retry shortly.", headers=RETRY)
            return None
        if not hmac.compare_digest(entry.key_hash, digest) \
                or self._clock() >= entry.valid_until:
            return None
        if self._closed() and self._stale():
            raise KeysUnavailable("API keys cannot be checked right now (the key store is "
                                  "unavailable); retry shortly.", headers=RETRY)
        return entry.identity

    def entry(self, digest: str | None) -> ManagedKey | None:
        """The managed key behind an authenticated caller's hash (limits, budgets)."""
        return None if digest is None else self._by_hash.get(digest)

    def _closed(self) -> bool:
        return self.settings.on_store_error == "fail_closed"

    def _stale(self) -> bool:
        confirmed = self.confirmed_at
        return confirmed is None or time.monotonic() - confirmed > self.settings.max_stale_s

    # -- keeping it current -------------------------------------------------------------

    def apply(self, records: Iterable[KeyRecord]) -> None:
        for record in records:
            for digest in self._hashes.pop(record.id, ()):
                self._by_hash.pop(digest, None)
            self.records[record.id] = record
            if record.revoked_at is not None:
                continue
            expires = math.inf if record.expires_at is None else record.expires_at
            hashes = [record.key_hash]
            self._by_hash[record.key_hash] = ManagedKey(
                record.key_hash, record, Identity(record.tenant, record.key_hash), expires)
            if record.previous_hash is not None and record.previous_until is not None:
                hashes.append(record.previous_hash)
                self._by_hash[record.previous_hash] = ManagedKey(
                    record.previous_hash, record, Identity(record.tenant, record.previous_hash),
                    min(expires, record.previous_until))
            self._hashes[record.id] = tuple(hashes)

    def changed(self) -> None:
        """Another replica wrote a key: check the store now."""
        self._dirty.set()

    async def check(self) -> None:
        """Bring the view up to the store's latest write (`KeyStoreUnavailable` if out)."""
        started = time.monotonic()
        if not self.loaded:
            records, sequence = await self.store.snapshot()
            self._by_hash, self._hashes, self.records = {}, {}, {}
            self.apply(records)
            self.sequence, self.loaded = sequence, True
        else:
            sequence = await self.store.sequence()
            if sequence < self.sequence:  # the store was emptied or replaced: start again
                self.loaded = False
                await self.check()
                return
            if sequence != self.sequence:
                records, sequence = await self.store.changes_since(self.sequence)
                self.apply(records)
                self.sequence = sequence
        self.confirmed_at = started
        if self.failing is not None:
            log.warning("key store reachable again (%s); keys are current", self.store.name)
            self.failing = None

    async def run(self) -> None:
        """Checks every `check_interval_s`, and at once on a notification; forever."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._checks())
            if self.store.notifications() is not None:
                group.create_task(self._notifications())

    async def _checks(self) -> None:
        while True:
            try:
                await self.check()
            except KeyStoreUnavailable as exc:
                if self.failing is None:
                    log.warning("key store unavailable (%s): managed keys are %s after %.1f s",
                                exc, "refused" if self._closed() else "served as last known",
                                self.settings.max_stale_s)
                self.failing = str(exc)
            except Exception:  # a task supervisor: a bad record must not stop the checks
                log.exception("key store check failed")
                self.failing = "check failed"
            try:
                async with asyncio.timeout(self.settings.check_interval_s):
                    await self._dirty.wait()
            except TimeoutError:
                pass
            self._dirty.clear()

    async def _notifications(self) -> None:
        while True:
            stream = self.store.notifications()
            if stream is None:
                return
            try:
                async for _ in stream:
                    self._dirty.set()
            except KeyStoreUnavailable:
                pass  # the periodic check reports the outage
            except Exception:  # a task supervisor: the checks go on, and so do we
                log.exception("key notifications dropped; subscribing again")
            await asyncio.sleep(self.settings.check_interval_s)
