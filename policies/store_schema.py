"""File models of the stores: where limits, spend and shared state are kept, and when a
slow one counts as out. Re-exported by `schema.py`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from policies.file_model import FileModel, PositiveFloat, PositiveInt

# memory | redis://host:port/db | redis+cluster://node,node | redis+sentinel://s,s/name
# (editors only: `LimitStore._store_known` checks, with its wording)
STORE_URL_PATTERN = r"^(memory$|rediss?://|unix://|redis\+(cluster|sentinel)://)"


class StoreLatency(FileModel):
    """How slow the shared limit store may be before it is treated as out."""

    p99_ms: PositiveFloat | None = 50.0
    """Out when, in each of `window_s` seconds in a row, more than 1 % of its calls took
    longer than this (its p99 stayed over it); back once three probes in a row answer within
    it. none: judged by `call_timeout_ms` alone."""
    window_s: PositiveInt = 3
    """Seconds in a row (each with calls) the p99 must stay over `p99_ms`: a burst that
    slows the gateway for a moment is not an outage."""
    call_timeout_ms: PositiveInt = 1000
    """The longest a request waits on one call to the store; a call past it puts the store
    out at once (as too slow) and the request is decided as `on_store_error` says."""


class LimitStore(FileModel):
    store: str = Field("memory", json_schema_extra={"pattern": STORE_URL_PATTERN})
    """Where limits and spend are counted: `memory` (this process), a `redis://` URL shared by every
    replica, `redis+cluster://NODE,…` or `redis+sentinel://SENTINEL,…/SERVICE`.
    `ROUTEGATE_REDIS_URL` overrides it. Read at start-up."""
    on_store_error: Literal["fail_open", "fail_closed"] = "fail_open"
    """When Redis is unreachable or too slow (`store_latency`): `fail_open` decides locally
    with this replica's share, `fail_closed` answers 503."""
    replicas: PositiveInt = 1
    """Gateway replicas sharing the limits; each allows limit / replicas while Redis is down."""
    store_latency: StoreLatency = StoreLatency()
    """When a reachable but slow Redis counts as out (with `on_store_error`'s behaviour)."""

    @field_validator("store")
    @classmethod
    def _store_known(cls, store: str) -> str:
        if store != "memory" and not store.startswith((
                "redis://", "rediss://", "unix://", "redis+cluster://", "redis+sentinel://")):
            raise ValueError("must be `memory`, a redis:// URL, redis+cluster://NODE,… "
                             "or redis+sentinel://SENTINEL,…/SERVICE")
        return store


class SharedState(FileModel):
    """State every replica and worker should see: `memory` (this process only) or Redis."""

    store: str = Field("memory", json_schema_extra={"pattern": STORE_URL_PATTERN})
    """`memory` (this process only) or a `redis://` URL every replica and worker shares."""
    max_memory_bytes: PositiveInt = 64 * 1024 * 1024
    """The most the `memory` store holds."""

    @field_validator("store")
    @classmethod
    def _store_known(cls, store: str) -> str:
        return LimitStore._store_known(store)


class ResponsesState(SharedState):
    """Responses kept for `GET /v1/responses/{id}` and `previous_response_id`."""

    ttl_s: PositiveFloat = 86_400.0
    """Seconds a response is kept for `GET /v1/responses/{id}` and `previous_response_id`."""
