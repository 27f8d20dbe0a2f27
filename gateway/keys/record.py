"""A managed key as the store keeps it: the hash of the key (never the key), whose it is,
what it may do and spend. Plain values, one JSON object per key in either store."""

from __future__ import annotations

import secrets
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import orjson

SCOPES = ("admin:read", "admin:write")


_last_ms = 0


def new_key_id() -> str:
    """`key_` + 12 hex digits of time (ms) + 8 random: ids sort by creation. Within a
    process they strictly increase: a key made in the same millisecond as the one before
    takes the next millisecond, so its random part cannot sort it first."""
    global _last_ms
    _last_ms = max(int(time.time() * 1000), _last_ms + 1)
    return f"key_{_last_ms:012x}{secrets.token_hex(4)}"


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str
    key_hash: str  # sha256:<hex> of the current key
    tenant: str
    name: str = ""
    labels: tuple[str, ...] = ()
    allow: tuple[str, ...] | None = None  # route globs, within the tenant's; None: tenant's
    allow_targets: tuple[str, ...] | None = None  # `backend/model` globs, within the tenant's
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    budget_day_micros: int | None = None
    budget_month_micros: int | None = None
    budget_total_micros: int | None = None
    expires_at: float | None = None  # epoch seconds; None: never
    scopes: tuple[str, ...] = ()  # admin:read, admin:write
    created_at: float = 0.0
    updated_at: float = 0.0
    revoked_at: float | None = None
    # after a rotation, the replaced key keeps working until `previous_until`
    previous_hash: str | None = None
    previous_until: float | None = None

    @property
    def has_budget(self) -> bool:
        return (self.budget_day_micros is not None or self.budget_month_micros is not None
                or self.budget_total_micros is not None)

    @property
    def limited(self) -> bool:
        return (self.has_budget or self.requests_per_minute is not None
                or self.tokens_per_minute is not None)

    def active(self, now: float) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def status(self, now: float) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "active"

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> KeyRecord:
        data = orjson.loads(raw)
        for name in ("labels", "scopes"):
            data[name] = tuple(data.get(name) or ())
        for name in ("allow", "allow_targets"):
            if data.get(name) is not None:
                data[name] = tuple(data[name])
        known = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        return cls(**known)

    def public(self, now: float) -> dict[str, Any]:
        """What the admin API shows: everything but the hashes (not secrets, but of no use
        to a reader and the first thing a leak would be searched for)."""
        return {
            "id": self.id, "object": "api_key", "tenant": self.tenant, "name": self.name,
            "labels": list(self.labels), "status": self.status(now),
            "allow": None if self.allow is None else list(self.allow),
            "allow_targets": None if self.allow_targets is None else list(self.allow_targets),
            "limits": {"requests_per_minute": self.requests_per_minute,
                       "tokens_per_minute": self.tokens_per_minute},
            "budget": {"usd_per_day": _usd(self.budget_day_micros),
                       "usd_per_month": _usd(self.budget_month_micros),
                       "usd_total": _usd(self.budget_total_micros)},
            "expires_at": self.expires_at, "scopes": list(self.scopes),
            "created_at": self.created_at, "updated_at": self.updated_at,
            "revoked_at": self.revoked_at,
            "previous_key_valid_until": self.previous_until,
        }

    def updated(self, now: float, **changes: Any) -> KeyRecord:
        return replace(self, updated_at=now, **changes)


def _usd(micros: int | None) -> float | None:
    return None if micros is None else micros / 1_000_000
