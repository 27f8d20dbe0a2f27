"""Managed API keys: issued, limited, rotated and revoked through `/admin/keys` without
editing the policy; their spend and an audit log of every admin action (docs/keys.md)."""

from gateway.keys.admission import KeyAdmission
from gateway.keys.install import install, store_for
from gateway.keys.record import KeyRecord
from gateway.keys.redis_store import RedisKeyStore
from gateway.keys.sqlite_store import SqliteKeyStore
from gateway.keys.store import KeyStore, KeyStoreUnavailable, SpendRow
from gateway.keys.view import KeysUnavailable, KeyView

__all__ = [
    "KeyAdmission",
    "KeyRecord",
    "KeyStore",
    "KeyStoreUnavailable",
    "KeyView",
    "KeysUnavailable",
    "RedisKeyStore",
    "SpendRow",
    "SqliteKeyStore",
    "install",
    "store_for",
]
