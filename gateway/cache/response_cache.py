"""The response cache: `hooks.cache`, serving kept answers and keeping new ones.

After routing (so the route, the tenant's mapping and PII findings are known) a request
on a route with `cache:` is looked up under its key (`key.py`); a hit is answered from
the kept completion, as JSON or as the chunk stream a backend would have sent, with no
backend call; settlement charges it nothing. A miss goes to a backend as usual and,
after settlement, its answer is kept: a 200 `chat.completion` (a stream once it has
ended cleanly, assembled from the events relayed), at most `max_entry_bytes`. Errors,
cut streams and other APIs' answers are never kept.

Every answer on such a route says what happened: `x-routegate-cache: hit | miss |
bypass`, a `cache` entry in Server-Timing (the lookup's time), the root span's
`routegate.cache`, and the counters `CacheCollector` exports. A store that fails (Redis
down) makes the request a bypass: no cache, never an error.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass

import orjson
from aiohttp import web

from gateway.cache.entry import Body, assembled, decode, encode, replayed
from gateway.cache.key import Mode, cache_key, mode_of
from gateway.core.context import RequestContext
from gateway.core.record import RequestRecord
from gateway.core.sse import DONE_EVENT, comment
from gateway.core.stream_out import STREAM_HEADERS, stream_writers
from gateway.core.whole_response import WholeResponse
from gateway.stores.blobs import BlobStore, BlobStoreUnavailable
from policies.schema import RouteCache
from routing.decide import RouteDecision

log = logging.getLogger("routegate.cache")

HEADER = "x-routegate-cache"
_CHAT = "/chat/completions"
_COMPLETION_MARK = b'"chat.completion"'


@dataclass(frozen=True, slots=True)
class Plan:
    route: str
    settings: RouteCache
    key: str
    mode: Mode


@dataclass(slots=True)
class RouteCounts:
    hits: int = 0
    misses: int = 0
    bypasses: int = 0
    store_errors: int = 0
    kept_bytes: int = 0  # written to the store
    served_bytes: int = 0  # answered from it
    saved_micros: int = 0  # what the hits would have cost, as their misses were charged


class ResponseCache:
    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs
        self.counts: defaultdict[str, RouteCounts] = defaultdict(RouteCounts)

    def plan(self, ctx: RequestContext) -> Plan | None:
        """None: the request's route keeps no answers (or this is no chat request)."""
        if ctx.endpoint.path != _CHAT:
            return None
        decision = ctx.decision
        features = decision.features if isinstance(decision, RouteDecision) else None
        route = features.route if features is not None else ctx.record.requested_model
        spec = ctx.policy.file.routes.get(route)
        if spec is None or spec.cache is None:
            return None
        settings = spec.cache
        mode = mode_of(ctx.request.headers, ctx.body, settings, ctx.policy.file.compliance,
                       pii_found=bool(features is not None and features.pii))
        tenant = None
        if settings.scope == "tenant":
            tenant = ctx.identity.tenant
        return Plan(route, settings, cache_key(route, ctx.body, _CHAT, tenant), mode)

    def _note(self, ctx: RequestContext, outcome: str) -> None:
        ctx.record.cache = outcome
        ctx.response_headers[HEADER] = outcome

    async def serve(self, ctx: RequestContext, plan: Plan) -> web.StreamResponse | None:
        counts = self.counts[plan.route]
        if plan.mode == "bypass":
            counts.bypasses += 1
            self._note(ctx, "bypass")
            return None
        if plan.mode == "use":
            started = ctx.timing.clock()
            try:
                stored = await self.blobs.get(plan.key)
            except BlobStoreUnavailable as exc:
                log.warning("response cache unavailable: %s", exc)
                counts.store_errors += 1
                counts.bypasses += 1
                self._note(ctx, "bypass")
                return None
            finally:
                ctx.timing.add_wait("cache", ctx.timing.clock() - started)
            if stored is not None:
                completion, cost = decode(stored)
                counts.hits += 1
                counts.served_bytes += len(completion)
                counts.saved_micros += cost
                self._note(ctx, "hit")
                return await self._answer(ctx, completion)
        counts.misses += 1
        self._note(ctx, "miss")
        if ctx.record.stream:
            ctx.cache_capture = []
        return None

    async def _answer(self, ctx: RequestContext, completion: bytes) -> web.StreamResponse:
        record = ctx.record
        record.status = 200
        if not record.stream:
            return WholeResponse(status=200, body=completion, headers={
                "Content-Type": "application/json", "X-Request-Id": ctx.record.request_id,
                **ctx.response_headers})
        client = web.StreamResponse(status=200, headers={
            **STREAM_HEADERS, **ctx.response_headers, "X-Request-Id": ctx.record.request_id,
            "Server-Timing": ctx.timing.server_timing()})
        await client.prepare(ctx.request)
        ctx.bytes_sent = True
        _, write_last = stream_writers(client, ctx.endpoint.dialect)
        events = replayed(orjson.loads(completion), with_usage=record.client_wants_usage)
        await write_last(events + comment("server-timing " + ctx.timing.server_timing())
                         + DONE_EVENT)
        return client

    async def keep(self, ctx: RequestContext, plan: Plan, response: web.StreamResponse) -> None:
        record = ctx.record
        if record.cache != "miss" or record.status != 200 or record.error_code is not None:
            return  # no cache here, a hit or a bypass, or not a whole answer
        if ctx.cache_capture is not None:
            whole = assembled(b"".join(ctx.cache_capture), _usage(record))
            ctx.cache_capture = None
            if whole is None:
                return
            body = orjson.dumps(whole)
        elif isinstance(response, WholeResponse) and _COMPLETION_MARK in response.body:
            body = response.body
        else:
            return  # another API's answer (a native Responses backend's), or not JSON
        if len(body) > plan.settings.max_entry_bytes:
            return
        entry = encode(body, record.cost_micros or 0)
        try:
            await self.blobs.put(plan.key, entry, plan.settings.ttl_s)
        except BlobStoreUnavailable as exc:
            log.warning("response cache unavailable: %s", exc)
            self.counts[plan.route].store_errors += 1
            return
        self.counts[plan.route].kept_bytes += len(entry)


def _usage(record: RequestRecord) -> Body | None:
    """The `usage` of an answer assembled from a stream: the request's counts as its
    record holds them (the backend's, or what settlement charged where it gave none)."""
    tokens_in, tokens_out = record.input_tokens, record.output_tokens
    if tokens_in is None and tokens_out is None:
        return None
    tokens_in, tokens_out = tokens_in or 0, tokens_out or 0
    usage: Body = {"prompt_tokens": tokens_in, "completion_tokens": tokens_out,
                   "total_tokens": tokens_in + tokens_out}
    if record.cached_input_tokens is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": record.cached_input_tokens}
    return usage
