"""API keys as the policy file stores them: `sha256:<64 hex>`, never the key itself."""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "rg-"
_KEY_BYTES = 32  # 256 bits of randomness: guessing is out of the question


def hash_key(key: str) -> str:
    """The form a key takes in `tenants.*.api_keys` and `auth.admin_keys`."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    """A fresh random API key (shown once; only its hash goes in the policy)."""
    return KEY_PREFIX + secrets.token_urlsafe(_KEY_BYTES)
