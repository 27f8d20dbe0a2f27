"""Responses kept for `GET /v1/responses/{id}` and `previous_response_id`, per tenant.

Each entry holds the `response` object and the whole conversation up to it (earlier
turns, this input, this output) as Responses API items, so the next turn is one read,
whichever backend served the earlier ones. Entries expire after the policy's
`responses.ttl_s`; a tenant never reads another tenant's (the tenant is in the key).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from gateway.core.errors import GatewayError
from gateway.core.log_text import escaped
from gateway.stores.blobs import BlobStore, BlobStoreUnavailable

log = logging.getLogger("routegate.api.responses")

Body = dict[str, Any]


class StateUnavailable(GatewayError):
    status = 503
    code = "state_store_unavailable"
    type = "server_error"
    retryable = True


class StoredResponses:
    def __init__(self, blobs: BlobStore, ttl_s: float) -> None:
        self.blobs = blobs
        self.ttl_s = ttl_s

    @staticmethod
    def _key(tenant: str, response_id: str) -> str:
        return f"routegate:response:{{{tenant}}}:{response_id}"

    async def save(self, tenant: str, response: Body, items: list[Body]) -> None:
        """Kept for `ttl_s`. A store that is down loses the entry (logged): the answer
        itself has been given, and continuing from it is a 404 later."""
        value = orjson.dumps({"response": response, "items": items})
        try:
            await self.blobs.put(self._key(tenant, str(response.get("id"))), value, self.ttl_s)
        except BlobStoreUnavailable as exc:
            log.warning("response %s not stored: %s", escaped(str(response.get("id"))), exc)

    async def load(self, tenant: str, response_id: str) -> tuple[Body, list[Body]] | None:
        try:
            value = await self.blobs.get(self._key(tenant, response_id))
        except BlobStoreUnavailable as exc:
            raise StateUnavailable("Stored responses cannot be read now: their store is "
                                   "unavailable.") from exc
        if value is None:
            return None
        entry = orjson.loads(value)
        return entry["response"], entry["items"]

    async def delete(self, tenant: str, response_id: str) -> bool:
        try:
            return await self.blobs.delete(self._key(tenant, response_id))
        except BlobStoreUnavailable as exc:
            raise StateUnavailable("Stored responses cannot be changed now: their store "
                                   "is unavailable.") from exc
