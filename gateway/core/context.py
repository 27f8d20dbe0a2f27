"""The live objects of one request as it moves through the pipeline.

The context holds what only this process, and only while the request runs, can use:
the aiohttp request and the body parsed from it, the policy it runs under, its caller,
the routing decision and candidates, the deadline, the headers being built, the
response's state as it is written and the attempt in progress. Every fact about the
request (what was asked for, admission's estimate, each attempt's outcome, usage,
status, cost, timings) lives once, in its record (`ctx.record`, `core/record.py`):
readers read it there, and nothing here copies it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from gateway.core.attempt_facts import Attempt
from gateway.core.auth import UNAUTHENTICATED, Identity
from gateway.core.deadline import Deadline
from gateway.core.errors import GatewayError
from gateway.core.record import RequestRecord
from gateway.core.timing import RequestTimings
from gateway.core.whole_response import WholeResponse
from policies.load import ModelTarget, Policy
from routing.decide import RouteDecision

Body = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One OpenAI operation the gateway proxies."""

    name: str  # "chat.completions", "completions", "embeddings"
    path: str  # relative to the backend's base URL (which ends in /v1)
    check: Callable[[Body], None]  # raises BadRequest naming the param
    # Another API served through this one (Anthropic Messages, the Responses API, through
    # chat completions): its request becomes this endpoint's body, and the stream written
    # back is re-encoded.
    dialect: Dialect | None = None
    # how this endpoint's API writes an error (None: OpenAI's `{"error": {...}}`)
    errors: Callable[[GatewayError], WholeResponse] | None = None


class Dialect(Protocol):
    async def request(self, ctx: RequestContext, body: Body) -> Body:
        """The client's body → this endpoint's body (`ctx.identity` is known); raises
        BadRequest."""
        ...

    def native(self, target: ModelTarget) -> tuple[str, bytes] | None:
        """(path, body) for a backend that speaks the client's API itself, where the
        request goes as the client wrote it; None: the translated body, through the
        adapter. Raises BadRequest when the request cannot be translated for `target`."""
        ...

    def stream_encoder(self) -> Callable[[bytes], bytes]:
        """A fresh per-response encoder of the SSE bytes the pipeline writes."""
        ...

    async def stream_finished(self) -> None:
        """The stream's last bytes are encoded and about to leave: state the client may
        ask for as soon as it has them (a stored response) is saved now."""
        ...

    async def whole_answer(self, response: WholeResponse) -> WholeResponse:
        """A whole (not streamed) answer of this endpoint, a backend's error included, as
        the client's API says it; raises a GatewayError. Called inside the pipeline, so
        the status the request is recorded with is the one the client gets."""
        ...


@dataclass(slots=True, eq=False)
class RequestContext:
    request: web.Request
    endpoint: Endpoint
    policy: Policy  # the policy this request started under; a reload does not change it
    timing: RequestTimings
    record: RequestRecord  # what this request did, for every report on it
    # who is asking (the anonymous tenant included): authentication is the first step,
    # so every plug-in runs after it has replaced UNAUTHENTICATED
    identity: Identity = UNAUTHENTICATED
    raw: bytes = b""  # the body exactly as the client sent it
    body: Body = field(default_factory=dict)  # parsed once; treat as read-only
    candidates: Sequence[ModelTarget] = ()  # ordered: primary first, then fallbacks
    decision: RouteDecision | None = None  # routing's own record of why (None: no router)
    deadline: Deadline | None = None  # from the latency budget, once routed; None: none
    # the attempt in progress, or the last one (None: none got past its queue); the
    # request's attempts are the record's (`record.attempts`)
    attempt: Attempt | None = None
    upstream_headers: dict[str, str] = field(default_factory=dict)  # added to the upstream call
    # the refusal the answer is written from (its status and code are the record's)
    error: GatewayError | None = None
    bytes_sent: bool = False  # the answer's head is written: a failure can only end the stream
    # the response cache: a streamed answer's events as relayed, to keep
    cache_capture: list[bytes] | None = None
    # Headers plug-ins give every response of this request from the moment they are set
    # (rate-limit state, the routing decision): on the relayed response, and on an error
    # through `GatewayError.headers` (its own values win, e.g. a 429's).
    response_headers: dict[str, str] = field(default_factory=dict)
