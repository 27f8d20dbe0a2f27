"""File model of the key service: where managed keys live and what a replica does when
their store cannot be reached. Re-exported by `schema.py`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from policies.file_model import FileModel, PositiveFloat
from policies.store_schema import STORE_URL_PATTERN, LimitStore


class KeyService(FileModel):
    """Keys issued through `/admin/keys` (docs/keys.md), beside the policy file's own."""

    store: str = Field("embedded", json_schema_extra={
        "pattern": STORE_URL_PATTERN.replace("^(memory$", "^(embedded$")})
    """`embedded` (SQLite under the data directory, one machine) or a `redis://` URL every
    replica shares (`ROUTEGATE_REDIS_URL` overrides it). Read at start-up."""
    check_interval_s: PositiveFloat = 0.5
    """Seconds between two checks of the store for changes, beside its notifications (a
    revoked key stops working within this on every replica even if a notification is lost)."""
    on_store_error: Literal["fail_closed", "fail_open"] = "fail_closed"
    """While the store cannot be reached for longer than `max_stale_s` (so revocations made
    meanwhile are unseen): `fail_closed` answers managed keys 503, `fail_open` serves them as
    last known. Keys of the policy file work either way."""
    max_stale_s: PositiveFloat = 5.0
    """Seconds the replica's view of the keys may go unconfirmed before `on_store_error`
    applies."""
    audit_max_bytes: int = Field(10 * 1024 * 1024, gt=0)
    """Size of the audit log (`audit.log` under the data directory) before it is rotated."""
    audit_backups: int = Field(5, ge=0)
    """Rotated audit logs kept."""

    @field_validator("store")
    @classmethod
    def _store_known(cls, store: str) -> str:
        if store == "embedded":
            return store
        if store == "memory":
            raise ValueError("keys outlive the process: use `embedded` (SQLite) or a "
                             "redis:// URL")
        return LimitStore._store_known(store)
