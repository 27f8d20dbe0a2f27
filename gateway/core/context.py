"""What the gateway knows about one request as it moves through the pipeline."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from gateway.core.attempt_facts import AttemptFacts
from gateway.core.auth import Identity
from gateway.core.deadline import Deadline
from gateway.core.errors import GatewayError
from gateway.core.failures import UpstreamFailure
from gateway.core.record import AttemptRecord, RequestRecord
from gateway.core.sse import SseRelay
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


@dataclass(slots=True)
class Attempt:
    """One try on one candidate, as the pipeline decides with it: the target and how it
    failed. Its facts (status, error, timings) live once, in the request record's entry
    for it (`record`, from the moment it got past the queue)."""

    target: ModelTarget
    record: AttemptRecord | None = None
    failure: UpstreamFailure | None = None  # its kind says what the failure means
    # it timed out because the request's own deadline ran out, not the backend's
    # timeout: the gateway's limit, so no mark against the target's health
    deadline_cut: bool = False

    @property
    def status(self) -> int | None:
        """The backend's HTTP status, when it answered."""
        return self.record.status if self.record is not None else None

    @property
    def error(self) -> str | None:
        """What failed; None for the attempt that answered (or one still in its queue)."""
        return self.record.error if self.record is not None else None


@dataclass(slots=True, eq=False)
class RequestContext:
    request: web.Request
    endpoint: Endpoint
    policy: Policy  # the policy this request started under; a reload does not change it
    timing: RequestTimings
    request_id: str
    record: RequestRecord  # what this request did, for every report on it
    identity: Identity | None = None
    raw: bytes = b""  # the body exactly as the client sent it
    body: Body = field(default_factory=dict)  # parsed once; treat as read-only
    model: str = ""  # what the client asked for: a route name or "backend/model"
    stream: bool = False
    client_wants_usage: bool = False  # stream_options.include_usage was true
    candidates: Sequence[ModelTarget] = ()  # ordered: primary first, then fallbacks
    decision: RouteDecision | None = None  # routing's own record of why (None: no router)
    deadline: Deadline | None = None  # from the latency budget, once routed; None: none
    target: ModelTarget | None = None  # the candidate being tried / that answered
    attempts: list[Attempt] = field(default_factory=list)
    upstream_headers: dict[str, str] = field(default_factory=dict)  # added to the upstream call
    usage: dict[str, Any] | None = None  # from the JSON body or the final stream chunk
    status: int | None = None  # status sent to the client (499: the client went away)
    error: GatewayError | None = None  # what the client was told, if it failed
    bytes_sent: bool = False  # once True a failure can only end the stream
    facts: AttemptFacts | None = None  # the writer of the current attempt's facts
    # the response cache: a streamed answer's events as relayed, to keep
    cache_capture: list[bytes] | None = None
    # admission: the input-token estimate it reserved with (None: nothing estimated)
    # and what the tenant may still spend (None: no budget)
    estimated_input_tokens: int | None = None
    budget_left_micros: int | None = None
    # routing: a dedicated target's amortised price (µUSD per token, i.e. USD per
    # million tokens), what settlement charges; when the current attempt got its slot
    amortised_usd_per_mtok: float | None = None
    attempt_started_s: float | None = None  # on the request's timing clock
    sse_relay: SseRelay | None = None  # a streamed response's relay (what it produced)
    # Headers plug-ins give every response of this request from the moment they are set
    # (rate-limit state, the routing decision): on the relayed response, and on an error
    # through `GatewayError.headers` (its own values win, e.g. a 429's).
    response_headers: dict[str, str] = field(default_factory=dict)

    @property
    def caller(self) -> Identity:
        """Who is asking (the anonymous tenant included): authentication is the first
        step, so every plug-in runs after it."""
        identity = self.identity
        if identity is None:
            raise RuntimeError("the request is not authenticated yet")
        return identity
