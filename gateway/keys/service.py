"""The key service of one app: store, view, spend ledger, audit log and the admin guard,
wired once (`install.py`) and read by the admin handlers (`admin.py`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.core.live_policy import LivePolicy
from gateway.keys.admin_auth import FailedAuthGuard
from gateway.keys.audit import AuditLog
from gateway.keys.record import KeyRecord
from gateway.keys.spend import SpendLedger
from gateway.keys.store import KeyStore
from gateway.keys.view import KeyView
from gateway.limits.limiter import Limiter


@dataclass
class KeyService:
    store: KeyStore
    view: KeyView
    ledger: SpendLedger
    audit: AuditLog
    live: LivePolicy
    limiter: Limiter
    guard: FailedAuthGuard = field(default_factory=FailedAuthGuard)
    clock: Callable[[], float] = time.time

    async def written(self, record: KeyRecord) -> None:
        """A write of this replica's: in its own view at once (others follow the store)."""
        self.view.apply([record])
