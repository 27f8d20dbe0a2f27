"""The pipeline's seam to fleets: per attempt on a dedicated backend, the replica that
serves it and the tenant's cache salt in the body.

`ReplicaChooser.choose` is called with the pool's adapter for the target; it returns
that adapter (a shared API, or a dedicated backend whose tenant shares its cache), a
call that adds the salt, or a call on the replica `pick:` chose. The call counts the
request as outstanding on its replica until the response is released, reports each
outcome into the replica's health (a connect error, timeout or 5xx is a failure in a
row; anything answered a success), and, when the replica cannot be connected to at
all, tries one other replica at once (nothing was sent). Prompt and cached tokens per
backend and replica are counted by telemetry from each finished record
(`gateway/telemetry/prompt_tokens.py`); the chooser drops the counts of replicas gone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from time import monotonic
from typing import Any

from gateway.core.context import RequestContext
from gateway.core.deadline import Timeouts
from gateway.core.failures import ConnectRefused, ConnectTimeout, UpstreamFailure
from gateway.route.prefix_events import PREFIX_HEADER
from gateway.route.replicas import (
    Fleet,
    Fleets,
    Replica,
    cached_share,
    request_hashes,
    salt_for,
)
from gateway.upstream.pool import Upstream, UpstreamResponse
from gateway.upstream.rewrite import spliced_fields, with_fields
from policies.load import ModelTarget
from policies.schema import Backend


class ReplicaChooser:
    def __init__(self, fleets: Fleets) -> None:
        self.fleets = fleets

    def choose(self, ctx: RequestContext, target: ModelTarget,
               upstream: Upstream) -> Upstream | None:
        """What to send this attempt through; None: the fleet has no replica to serve."""
        backend = target.backend
        if backend.deployment != "dedicated" or backend.type != "openai":
            return upstream
        salt = salt_for(ctx, backend)
        fleet = self.fleets.get(target.backend_name)
        if fleet is None:
            return upstream if salt is None else ReplicaCall(ctx, upstream, salt)
        hashes = request_hashes(ctx, fleet, salt)
        percent = ctx.policy.file.resilience.outlier_detection.max_ejection_percent
        chosen = fleet.choose(hashes, percent)
        if chosen is None:
            return None
        fleet.index.record(hashes, chosen.replica)  # the next such prompt finds it here
        return ReplicaCall(ctx, upstream, salt, fleet, fleet.replicas[chosen.replica], hashes)

    def cached_share(self, ctx: RequestContext) -> dict[str, float] | None:
        """For routing's TTFT prediction (`RoutingHook.cached_share`)."""
        return cached_share(ctx, self.fleets)

    def forget_gone_replicas(self, counts: dict[tuple[str, str], list[int]]) -> None:
        """Replicas come and go (DNS): their token counts go once the table is full."""
        for backend, replica in list(counts):
            fleet = self.fleets.get(backend)
            if replica and (fleet is None or replica not in fleet.replicas):
                del counts[(backend, replica)]


class ReplicaCall:
    """One attempt's view of the backend: the `Upstream` the pipeline sends through."""

    def __init__(self, ctx: RequestContext, upstream: Upstream, salt: str | None,
                 fleet: Fleet | None = None, replica: Replica | None = None,
                 hashes: list[int] | None = None) -> None:
        self._ctx, self._salt = ctx, salt
        self._fleet, self._replica, self._hashes = fleet, replica, hashes or []
        self._inner: Upstream = replica.adapter if replica is not None else upstream
        self.backend: Backend = self._inner.backend
        self.base_url = self._inner.base_url
        self.on_resend: Callable[[str], None] | None = None

    def prepare(self, path: str, raw: bytes, body: dict[str, Any], *, model: str,
                stream_usage: bool, priority: str = "normal") -> bytes:
        encoded = self._inner.prepare(path, raw, body, model=model, stream_usage=stream_usage,
                                      priority=priority)
        if self._salt is None:
            return encoded
        fields = {"cache_salt": self._salt}
        return with_fields(encoded, body, fields, spliced_fields(fields))

    def band_header(self, priority: str) -> str | None:
        return self._inner.band_header(priority)

    async def open(self, path: str, body: bytes, headers: Mapping[str, str] | None = None,
                   timeouts: Timeouts | None = None) -> UpstreamResponse:
        if self._fleet is None or self._replica is None:
            return await self._inner.open(path, body, headers, timeouts)
        try:
            return await self._open_on(self._replica, path, body, headers, timeouts)
        except (ConnectRefused, ConnectTimeout):
            # nothing reached the replica: another one may take it at once
            other = self._other_replica()
            if other is None:
                raise
            return await self._open_on(other, path, body, headers, timeouts)

    def _other_replica(self) -> Replica | None:
        fleet, tried = self._fleet, self._replica
        assert fleet is not None and tried is not None
        percent = self._ctx.policy.file.resilience.outlier_detection.max_ejection_percent
        chosen = fleet.choose(self._hashes, percent)
        if chosen is None or chosen.replica == tried.name:
            return None
        fleet.index.record(self._hashes, chosen.replica)
        return fleet.replicas[chosen.replica]

    async def _open_on(self, replica: Replica, path: str, body: bytes,
                       headers: Mapping[str, str] | None,
                       timeouts: Timeouts | None) -> UpstreamResponse:
        fleet, ctx = self._fleet, self._ctx
        assert fleet is not None
        detection = ctx.policy.file.resilience.outlier_detection
        attempt = ctx.record.attempt
        if attempt is not None:
            attempt.replica = replica.name
        fleet.ejections.attempt_started(replica.name, monotonic(), detection)
        replica.outstanding += 1
        if fleet.precise:  # the replica names the prompt's blocks as this gateway does
            headers = {**(headers or {}), PREFIX_HEADER: fleet.block_chars_header}
        try:
            response = await replica.adapter.open(path, body, headers, timeouts)
        except UpstreamFailure as failure:
            replica.outstanding -= 1
            if failure.counts_against_health:  # the failure's kind: the replica's fault
                fleet.ejections.failed(replica.name, monotonic(), detection)
            else:  # a 429 or a refusal: an answer, the replica is up
                fleet.ejections.succeeded(replica.name, monotonic())
            raise
        except BaseException:
            replica.outstanding -= 1
            raise
        fleet.ejections.succeeded(replica.name, monotonic())
        done = response.on_done

        def released() -> None:
            replica.outstanding -= 1
            if done is not None:
                done()

        response.on_done = released
        return response

    async def close(self) -> None:
        return None

    def retire(self) -> None:
        return None

    @property
    def idle_closed(self) -> bool:
        return False

    @property
    def trust_rotated(self) -> bool:
        return False
