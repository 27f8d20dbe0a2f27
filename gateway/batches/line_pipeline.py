"""A batch line through the one path every request takes.

The seam is `Pipeline.handle` itself: `BatchPipeline` is the pipeline with four of its
steps told where a batch line's facts come from, everything else (access, compliance,
capabilities, limits and budget, routing, queueing, the upstream call, settlement,
telemetry) the same code as an interactive request's:

    begin           the record carries the batch id (metrics, access log, spans)
    authenticate    the key that created the batch, by its hash, against the live
                    policy (a key revoked since is refused; the header is not there)
    priority        the `batch` band, below every tenant's: queued last, shed and
                    preempted first
    read_body       the line's body (still held to `server.max_body_bytes`)
    route           routing's candidates, narrowed to where the runner placed the line
                    (dedicated capacity with room, or the spill targets)
    attempt         a dedicated backend also gets the line's `Idempotency-Key`
                    (`<batch id>/<line index>`): a line re-sent by the replica that took
                    the batch over from a dead one gets the answer of the run already
                    made (local_backend keeps it; docs/batches.md), never a second run

A line is a `web.Request` made inside the gateway (`gateway.compat.aiohttp`), never a
round trip over HTTP to itself: the gateway keeps no plain key to send, and a loopback
call would count the line twice in every connection and drain figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from gateway.batches.model import Placement
from gateway.compat.aiohttp import internal_request
from gateway.core.auth import TENANT_HEADER, Identity
from gateway.core.context import Endpoint, RequestContext
from gateway.core.errors import (
    TIMING_KEY,
    GatewayError,
    InternalError,
    PayloadTooLarge,
    Unauthorized,
)
from gateway.core.failures import UpstreamFailure
from gateway.core.timing import RequestTimings
from gateway.core.whole_response import WholeResponse
from gateway.pipeline.steps import Pipeline
from gateway.upstream.pool import Upstream
from policies.bands import BATCH_BAND, Priority
from policies.load import ModelTarget

# Where the engine is ours it runs a line once per key; a shared API gets no key (OpenAI's
# has none), so a line in flight there when its runner dies may be sent again.
IDEMPOTENCY_HEADER = "Idempotency-Key"


@dataclass(slots=True)
class LineCall:
    batch_id: str
    key_hash: str | None  # None: the batch was created anonymously
    body: bytes
    placement: Placement | None  # None: wherever routing says (no dedicated target)
    spill_to: tuple[str, ...] = ()
    idempotency_key: str | None = None  # `<batch id>/<line index>`: the same on every replica
    ctx: RequestContext | None = field(default=None, repr=False)  # once begun


@dataclass(frozen=True, slots=True)
class LineAnswer:
    status: int
    body: bytes
    retry_after_s: float | None  # a refusal worth trying again later (429, shed 503)
    ctx: RequestContext | None


LINE = web.RequestKey("routegate.batch_line", LineCall)


class BatchPipeline(Pipeline):
    async def run(self, endpoint: Endpoint, path: str, call: LineCall) -> LineAnswer:
        request = internal_request("POST", path, {"Content-Type": "application/json"},
                                   remote="batch")
        request[TIMING_KEY] = RequestTimings()
        request[LINE] = call
        try:
            response = await self.handle(request, endpoint)
        except Exception:  # a task supervisor: the line is an error record, never lost
            error = InternalError("The gateway failed to process this line.")
            return LineAnswer(500, _error_body(error), None, call.ctx)
        if not isinstance(response, WholeResponse):  # pragma: no cover - lines never stream
            raise AssertionError("a batch line got a streamed response")
        refused = call.ctx.error if call.ctx is not None else None
        if refused is not None:  # the pipeline's answer to it, in OpenAI's shape
            retry = refused.headers.get("Retry-After")
            again = refused.status == 429 or refused.rejection == "shed"
            return LineAnswer(refused.status, _error_body(refused),
                              float(retry or 1) if again else None, call.ctx)
        return LineAnswer(response.status, response.body, None, call.ctx)

    @staticmethod
    async def send(ctx: RequestContext, response: web.StreamResponse) -> None:
        """A line's answer is read from the response, not written: no client waits."""
        return None

    def begin(self, request: web.Request, endpoint: Endpoint) -> RequestContext:
        ctx = super().begin(request, endpoint)
        call = request[LINE]
        ctx.record.batch_id = call.batch_id
        call.ctx = ctx
        return ctx

    def authenticate(self, ctx: RequestContext) -> None:
        call = ctx.request[LINE]
        index = self.auth.index(ctx.policy)
        identity: Identity | None
        if call.key_hash is None:
            anonymous = ctx.policy.file.auth.anonymous
            identity = index.anonymous if anonymous.enabled else None
        else:
            identity = index.identity(call.key_hash)
        if identity is None:
            raise Unauthorized("The API key that created this batch is no longer valid.")
        ctx.identity = identity
        ctx.response_headers[TENANT_HEADER] = identity.tenant

    def priority(self, ctx: RequestContext, tenant: str) -> Priority:
        return BATCH_BAND

    async def read_body(self, ctx: RequestContext) -> None:
        body, limit = ctx.request[LINE].body, ctx.policy.file.server.max_body_bytes
        if len(body) > limit:
            raise PayloadTooLarge(f"The line's body exceeds the limit of {limit} bytes.")
        ctx.raw = body

    def route(self, ctx: RequestContext) -> None:
        super().route(ctx)
        call = ctx.request[LINE]
        placed = placed_candidates(ctx.candidates, call.placement, call.spill_to)
        if placed:  # else: the placement had nothing to choose from; routing's order
            ctx.candidates = placed


    async def attempt(self, ctx: RequestContext, target: ModelTarget, upstream: Upstream,
                      path: str, body: bytes) -> web.StreamResponse | UpstreamFailure:
        key = ctx.request[LINE].idempotency_key
        if key is not None and target.backend.deployment == "dedicated":
            ctx.upstream_headers[IDEMPOTENCY_HEADER] = key
        else:
            ctx.upstream_headers.pop(IDEMPOTENCY_HEADER, None)
        return await super().attempt(ctx, target, upstream, path, body)


def placed_candidates(candidates: Sequence[ModelTarget],
                      placement: Placement | None,
                      spill_to: tuple[str, ...]) -> list[ModelTarget]:
    """Routing's candidates (compliance already applied) on the capacity the line was
    placed on; a spill goes to the `spill_to` targets among them first."""
    if placement is None:
        return list(candidates)
    kind = [target for target in candidates if target.backend.deployment == placement]
    if placement == "shared" and spill_to:
        first = [target for key in spill_to for target in kind if target.key == key]
        kind = first + [target for target in kind if target not in first]
    return kind


def _error_body(error: GatewayError) -> bytes:
    return orjson.dumps(error.body())
