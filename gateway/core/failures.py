"""What went wrong with an upstream attempt, as a kind, decided once where it happened.

httpx's habit: its transport's errors are mapped once, at the boundary, onto classes
(`ConnectError`, `ReadTimeout`, ...) and nobody above re-derives them. Here the adapter
(`openai.OpenAIUpstream.open`) and the relay's reads of an upstream body map what they
see — an exception of the HTTP client, a status, a body that is not what the API
promises — onto one `UpstreamFailure` subclass. Everything that acts on a failure reads
the facts its class states instead of the status code:

    retryable               the same target may be tried again after a backoff
                            (`pipeline.retries`)
    needs_advice            ... only when the backend said how long to wait (`Retry-After`)
    counts_against_health   outlier ejection counts it against the target
                            (`route.hook.RoutingHook.attempt_finished`)
    timed_out               the backend went silent: 504 for the client, and no mark when
                            the request's own deadline was what cut it short
    metric_reason           the `reason` label of `routegate_upstream_failures_total`
    client_error            what the client is told if no other candidate answers

Every kind falls back to the next candidate (nothing has reached the client when one
is raised); `pipeline.outcome.exhausted` sums them up for the client.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import ClassVar

from gateway.core.errors import UpstreamError, UpstreamTimeout

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
UNSUPPORTED_ENDPOINT = "unsupported_endpoint"  # no such path (`/embeddings` on a chat server)


@dataclass(frozen=True, slots=True)
class Incapable:
    """A backend's 4xx that means "this model cannot do that", not "the request is
    wrong": another candidate may serve it, and routing remembers it for the target."""

    code: str  # context_length_exceeded | unsupported_parameter | unsupported_value | …
    param: str | None  # the field it named (`tools`, `response_format`, `messages`)
    message: str  # the backend's own words, for the client if no candidate can

    @property
    def context_exceeded(self) -> bool:
        return self.code == CONTEXT_LENGTH_EXCEEDED


class UpstreamFailure(Exception):
    """An attempt that failed before any byte reached the client. `message` names the
    backend and is what the client reads if no other candidate succeeds."""

    retryable: ClassVar[bool] = False
    needs_advice: ClassVar[bool] = False
    counts_against_health: ClassVar[bool] = True
    timed_out: ClassVar[bool] = False
    metric_reason: ClassVar[str] = "failed"
    client_error: ClassVar[type[UpstreamError] | type[UpstreamTimeout]] = UpstreamError

    def __init__(self, message: str, *, status: int | None = None, body: bytes = b"",
                 headers: Mapping[str, str] | None = None,
                 cannot: Incapable | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status  # the backend's HTTP status, when it answered
        self.body = body  # its error reply, read for its message only
        self.headers = dict(headers or {})
        self.cannot = cannot  # it answered it cannot do what was asked

    @property
    def error(self) -> UpstreamError | UpstreamTimeout:
        """The client's error, were this the last failure of the request."""
        return self.client_error(self.message)

    @property
    def retry_after_s(self) -> float | None:
        """How long the backend asked to be left alone (`retry-after-ms`, or
        `Retry-After` in seconds or as an HTTP date), when it said so."""
        return retry_after_s(self.headers)


# -- no answer -----------------------------------------------------------------------

class ConnectRefused(UpstreamFailure):
    """No connection (refused, unreachable, reset during the handshake): down, not slow."""

    retryable = True
    metric_reason = "connect_refused"


class ConnectTimeout(UpstreamFailure):
    """The connection did not open within `connect_s`. Slow is not down: not retried
    on the same target, but another candidate is tried."""

    timed_out = True
    metric_reason = "connect_timeout"
    client_error = UpstreamTimeout


class TlsRejected(UpstreamFailure):
    """The backend's certificate failed verification: the same again would too."""

    metric_reason = "tls_rejected"


class PoolTimeout(UpstreamFailure):
    """No free connection to the backend within `pool_wait_s` (all `max_connections`
    busy with slow answers)."""

    timed_out = True
    metric_reason = "pool_timeout"
    client_error = UpstreamTimeout


class ReadTimeout(UpstreamFailure):
    """Connected, then silent past `first_byte_s` (no head, or no next chunk) or past
    `total_s`."""

    timed_out = True
    metric_reason = "read_timeout"
    client_error = UpstreamTimeout


class UpstreamClosed(UpstreamFailure):
    """The backend closed or reset the connection before its answer was whole."""

    retryable = True
    metric_reason = "upstream_closed"


class MalformedResponse(UpstreamFailure):
    """An answer that is not what the API promises: broken HTTP framing, a reply that
    is not JSON, a stream event the relay will not forward, an empty stream."""

    metric_reason = "malformed_response"


class ResponseTooLarge(UpstreamFailure):
    """A reply over `server.max_upstream_body_bytes`: the gateway's bound, not a fault."""

    counts_against_health = False
    metric_reason = "response_too_large"


# -- an answer that says no ----------------------------------------------------------

class RateLimited(UpstreamFailure):
    """429: retried on the same target only when it said when (`Retry-After`)."""

    retryable = True
    needs_advice = True
    counts_against_health = False  # an answer, not a fault
    metric_reason = "rate_limited"


class Overloaded(UpstreamFailure):
    """503, or Anthropic's 529 `overloaded_error`: try again shortly."""

    retryable = True
    metric_reason = "overloaded"


class ServerError(UpstreamFailure):
    """Any other 5xx: the backend is broken for this request."""

    metric_reason = "server_error"


class CredentialsRefused(UpstreamFailure):
    """401/403: the backend refused the gateway's own key for it, not the client's."""

    counts_against_health = False
    metric_reason = "credentials_refused"


class Redirected(UpstreamFailure):
    """3xx: the backend's `url:` is out of date (http → https, a moved API)."""

    counts_against_health = False
    metric_reason = "redirected"


class ClientRejected(UpstreamFailure):
    """A 4xx saying this target cannot do what was asked (`cannot`): the request's
    doing, not the backend's fault; another candidate may serve it."""

    counts_against_health = False
    metric_reason = "client_error"


_BY_STATUS: dict[int, type[UpstreamFailure]] = {
    401: CredentialsRefused, 403: CredentialsRefused, 429: RateLimited,
    503: Overloaded, 529: Overloaded}


def status_kind(status: int) -> type[UpstreamFailure] | None:
    """The failure an answer's status is on its own, or None: a 2xx, or a 4xx whose
    body decides (relayed to the client, or a `ClientRejected` by the relay)."""
    kind = _BY_STATUS.get(status)
    if kind is None and status >= 500:
        return ServerError
    return kind


def status_failure(kind: type[UpstreamFailure], backend: str, status: int, body: bytes,
                   headers: Mapping[str, str]) -> UpstreamFailure:
    # a refusal of the gateway's key, relayed, would tell the client its own is wrong
    message = (f"Backend '{backend}' did not accept the gateway's credentials "
               f"(HTTP {status})." if kind is CredentialsRefused
               else f"Backend '{backend}' returned HTTP {status}.")
    return kind(message, status=status, body=body, headers=headers)


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """`retry-after-ms`, or `Retry-After` in seconds or as an HTTP date; None when
    absent or unreadable."""
    lowered = {name.lower(): value for name, value in headers.items()}
    try:
        if "retry-after-ms" in lowered:
            seconds = float(lowered["retry-after-ms"]) / 1000.0
        elif "retry-after" in lowered:
            value = lowered["retry-after"]
            try:
                seconds = float(value)
            except ValueError:
                seconds = parsedate_to_datetime(value).timestamp() - time.time()
        else:
            return None
    except (ValueError, TypeError):
        return None
    return max(0.0, seconds) if math.isfinite(seconds) else None
