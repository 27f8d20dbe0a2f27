"""The interface both key stores implement (SQLite embedded, Redis shared), and the
values they trade in: key records, a change cursor, and spend rows.

A store is the truth; each replica reads it into a `KeyView` (view.py) and keeps that
current with `changes_since` (every write bumps one sequence number and stamps the key
with it) and, where the store has them, notifications. Writes are whole records: a key
is created or replaced entirely, never half.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.keys.record import KeyRecord

SPEND_DIMENSIONS = ("tenant", "key", "model", "route", "backend")


class KeyStoreUnavailable(Exception):
    """The store could not be read or written (Redis down, the database locked too long)."""


class KeyExists(Exception):
    """`create` of an id the store already holds."""


@dataclass(frozen=True, slots=True)
class SpendRow:
    """One day's spend of one (tenant, key, model, route, backend); "" where unknown."""

    day: str  # "2026-12-03" (UTC)
    tenant: str
    key: str  # a managed key's id, "policy:<hash prefix>", or "" (anonymous)
    model: str
    route: str
    backend: str
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_micros: int = 0

    @property
    def dimensions(self) -> tuple[str, str, str, str, str, str]:
        return (self.day, self.tenant, self.key, self.model, self.route, self.backend)


class KeyStore(Protocol):
    name: str  # "embedded" | "redis"

    async def snapshot(self) -> tuple[list[KeyRecord], int]:
        """Every key, and the sequence number they are current to."""
        ...

    async def sequence(self) -> int:
        """The sequence number of the latest write (cheap: the periodic check)."""
        ...

    async def changes_since(self, sequence: int) -> tuple[list[KeyRecord], int]:
        """Keys written after `sequence`, and the sequence they are current to."""
        ...

    async def get(self, key_id: str) -> KeyRecord | None: ...

    async def create(self, record: KeyRecord) -> int:
        """Store a new key whole (`KeyExists` if the id is taken); its sequence number."""
        ...

    async def put(self, record: KeyRecord) -> int:
        """Replace an existing key whole (the last write wins); its sequence number."""
        ...

    def notifications(self) -> AsyncIterator[str] | None:
        """Ids of keys as other replicas write them, or None (no notifications)."""
        ...

    async def add_spend(self, rows: Sequence[SpendRow]) -> None: ...

    async def spend(self, first_day: str, last_day: str) -> list[SpendRow]:
        """Every row from `first_day` to `last_day`, both included."""
        ...

    async def key_total_micros(self, key_ids: Sequence[str]) -> dict[str, int]:
        """What each key has spent since it was created."""
        ...

    async def aclose(self) -> None: ...
