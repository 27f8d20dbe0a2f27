"""A policy with tenants and an admin key, and the admin API as plain calls, for the
managed-key tests."""

from __future__ import annotations

import hashlib
from typing import Any

import aiohttp

ADMIN_KEY = "admin-key"
POLICY_KEY = "acme-policy-key"
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def sha(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def keys_policy(url: str, *, store: str | None = None, **keys: Any) -> dict[str, Any]:
    """Tenants `acme` (a policy key) and `globex`, routes `chat` and `embed`, priced so
    that a request costs something, and `auth.admin_keys`; `store`: a Redis URL for
    limits and keys alike."""
    policy: dict[str, Any] = {
        "version": 1,
        "backends": {"up": {"type": "openai", "url": url, "models": {
            "gpt-4o-mini": {"input_usd_per_mtok": 10_000.0, "output_usd_per_mtok": 10_000.0},
            "other": {}}}},
        "routes": {"chat": {"targets": ["up/gpt-4o-mini"]}, "embed": {"targets": ["up/other"]}},
        "tenants": {"acme": {"api_keys": [sha(POLICY_KEY)], "allow": ["chat", "embed"],
                             "allow_targets": ["up/*"]},
                    "globex": {"allow": ["chat"]}},
        "auth": {"anonymous": {"enabled": False}, "admin_keys": [sha(ADMIN_KEY)]},
    }
    if store is not None:
        policy["limits"] = {"store": store}
        keys = {"store": store, **keys}
    if keys:
        policy["keys"] = keys
    return policy


class AdminApi:
    def __init__(self, url: str, key: str = ADMIN_KEY) -> None:
        self.url = url
        self.key = key

    async def call(self, method: str, path: str, body: Any = None,
                   key: str | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {key or self.key}"}
        async with aiohttp.ClientSession() as session, session.request(
                method, self.url + path, json=body, headers=headers) as response:
            if response.content_type == "application/json":
                return response.status, await response.json()
            return response.status, await response.text()

    async def create(self, **fields: Any) -> dict[str, Any]:
        status, body = await self.call("POST", "/admin/keys", {"tenant": "acme", **fields})
        assert status == 201, body
        return body


async def chat(url: str, key: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
            url + "/v1/chat/completions", json=body or CHAT,
            headers={"Authorization": f"Bearer {key}"}) as response:
        return response.status, await response.json()
