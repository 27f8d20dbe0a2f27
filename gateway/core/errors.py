"""One error root for everything a client can be told, and the middleware that renders it.

Every error leaves the gateway as OpenAI-shaped JSON
(`{"error": {"message", "type", "code", "param"}}`) so the official SDKs raise
their usual exceptions (`openai.BadRequestError`, `openai.RateLimitError`, ...).
Library errors are translated where they happen (`raise UpstreamTimeout(...) from exc`);
`except Exception` lives only in `error_middleware`, which turns anything unexpected
into a 500 without a traceback for the client.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import ClassVar

import orjson
from aiohttp import web

from gateway.core.log_text import json_text
from gateway.core.timing import RequestTimings
from gateway.core.whole_response import WholeResponse

log = logging.getLogger("routegate.errors")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Where the middleware finds the per-request timing, so error responses carry it too.
TIMING_KEY = web.RequestKey("routegate.timing", RequestTimings)


class GatewayError(Exception):
    """An error with an HTTP status that a client is allowed to see.

    `headers` is a plain dict on purpose: whoever raises (the rate limiter, say) or
    whoever catches on the way out may attach `Retry-After`, `x-ratelimit-*`, ...
    """

    status: ClassVar[int] = 500
    code: ClassVar[str | None] = "internal_error"
    type: ClassVar[str] = "server_error"
    retryable: ClassVar[bool] = False
    # False where another part reports these in summary (an outage: one line per
    # interval with a count, not one per request); the middleware logs each at DEBUG
    log_each: ClassVar[bool] = True
    # the connection closes once the error is sent (what is left of it is not read)
    ends_connection: ClassVar[bool] = False
    # A refusal before any upstream attempt that metrics count as one: rate_limit,
    # budget or shed, and the limit it names (the `limit` label: rpm, tpm, budget, …)
    rejection: ClassVar[str | None] = None
    rejected_limit: ClassVar[str | None] = None

    def __init__(self, message: str, *, param: str | None = None,
                 headers: Mapping[str, str] | None = None, code: str | None = None,
                 detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers: dict[str, str] = dict(headers or {})
        # For the client only, never logged: e.g. what a backend answered, which may
        # quote the request or a completion (logs and spans carry neither).
        self.detail = detail
        if code is not None:
            self.code = code  # type: ignore[misc]  # an instance may refine the class default

    @property
    def client_message(self) -> str:
        """What the client reads: the message, and the detail when there is one."""
        return self.message if self.detail is None else f"{self.message} {self.detail}"

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.client_message, "type": self.type,
                          "code": self.code, "param": self.param}}

    def to_response(self) -> WholeResponse:
        return WholeResponse(status=self.status, body=orjson.dumps(self.body()),
                             headers={**self.headers, "Content-Type": "application/json"})


class BadRequest(GatewayError):
    status = 400
    code = "invalid_request_error"
    type = "invalid_request_error"


def json_type_name(value: object) -> str:
    """JSON's name for the type of a parsed value, as error messages say it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def wrong_type(param: str, expected: str, value: object) -> BadRequest:
    """The 400 for a field of the wrong JSON type, in OpenAI's words."""
    return BadRequest(f"Invalid type for '{param}': expected {expected}, "
                      f"but got {json_type_name(value)}.", param=param, code="invalid_type")


class Unauthorized(GatewayError):
    status = 401
    code = "invalid_api_key"
    type = "authentication_error"


class Forbidden(GatewayError):
    status = 403
    code = "forbidden"
    type = "permission_error"


class NotFound(GatewayError):
    status = 404
    code = "not_found"
    type = "invalid_request_error"


class ModelNotFound(NotFound):
    code = "model_not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    code = "method_not_allowed"
    type = "invalid_request_error"


class PayloadTooLarge(GatewayError):
    status = 413
    code = "request_too_large"
    type = "invalid_request_error"


class RequestTimeout(GatewayError):
    status = 408
    code = "request_timeout"
    type = "invalid_request_error"
    ends_connection = True  # the client stopped sending: nothing more is read


class TooManyConnections(GatewayError):
    status = 429
    code = "too_many_connections"
    type = "rate_limit_error"


class HttpVersionNotSupported(GatewayError):
    """505: a request line naming an HTTP version other than 1.0 or 1.1."""

    status = 505
    code = "http_version_not_supported"
    type = "invalid_request_error"


class RequestLineTooLong(GatewayError):
    """431: the request line or a header line is over the HTTP parser's limit."""

    status = 431
    code = "request_header_too_large"
    type = "invalid_request_error"


class RateLimited(GatewayError):
    """429; the limiter attaches `Retry-After` and `x-ratelimit-*` through `headers`."""

    status = 429
    code = "rate_limit_exceeded"
    type = "rate_limit_error"
    retryable = True
    rejection = "rate_limit"
    rejected_limit = "rate"


class InternalError(GatewayError):
    status = 500


class UpstreamError(GatewayError):
    """The backend failed (connection refused, 5xx, malformed reply); names the backend."""

    status = 502
    code = "upstream_error"
    type = "server_error"
    retryable = True


class NoBackendAvailable(GatewayError):
    status = 503
    code = "no_backend_available"
    type = "server_error"
    retryable = True


class ShuttingDown(GatewayError):
    """The gateway is draining and its drain timeout cut this request short."""

    status = 503
    code = "server_shutting_down"
    type = "server_error"
    retryable = True


class UpstreamTimeout(GatewayError):
    status = 504
    code = "upstream_timeout"
    type = "server_error"
    retryable = True


class DeadlinePassed(GatewayError):
    status = 504
    code = "deadline_exceeded"
    type = "server_error"


class UpstreamClientError(GatewayError):
    """A 4xx from the backend whose body was not OpenAI-shaped: relay its status."""

    type = "invalid_request_error"
    code = "upstream_rejected"

    def __init__(self, status: int, message: str, *, detail: str | None = None) -> None:
        super().__init__(message, detail=detail)
        self.status = status  # type: ignore[misc]


def _from_http_exception(exc: web.HTTPException, request: web.Request) -> GatewayError:
    if exc.status == 404:
        return _unknown_path(request)
    if exc.status == 405:
        allowed = exc.headers.get("Allow", "")
        methods = " or ".join(m.strip() for m in allowed.split(",") if m.strip())
        return MethodNotAllowed(
            f"{exc.method if isinstance(exc, web.HTTPMethodNotAllowed) else 'This method'} is "
            f"not allowed on this path; it takes {methods or 'no method'}.",
            headers={"Allow": allowed})
    if exc.status == 413:
        return PayloadTooLarge("Request body is too large.")
    error = GatewayError(exc.reason or "HTTP error")
    error.status = exc.status  # type: ignore[misc]
    error.type = "invalid_request_error" if exc.status < 500 else "server_error"  # type: ignore[misc]
    error.code = None  # type: ignore[misc]
    return error


def _unknown_path(request: web.Request) -> NotFound:
    """A 404 that says what is served: under /v1, the paths this gateway answers."""
    if request.path != "/v1" and not request.path.startswith("/v1/"):
        return NotFound(f"Unknown path {request.path}; the API is served under /v1 "
                        "(see GET /v1/models).")
    served = sorted({info.get("path") or info.get("formatter") or ""
                     for resource in request.app.router.resources()
                     for info in (resource.get_info(),)} - {""})
    under_v1 = [path.removeprefix("/v1") for path in served if path.startswith("/v1/")]
    return NotFound(f"Unknown path {request.path}: this gateway does not serve it. Under "
                    f"/v1 it serves {', '.join(under_v1)}.")


def error_level(error: GatewayError) -> int:
    """DEBUG for errors reported in summary elsewhere, WARNING for the gateway's own
    failures (5xx), INFO for the client's."""
    if not error.log_each:
        return logging.DEBUG
    return logging.WARNING if error.status >= 500 else logging.INFO


def error_line(request: web.BaseRequest, error: GatewayError) -> str:
    """The log line of an error answered to a client: a JSON object with the access
    log's field names, every string in it escaped (the path is the client's, the
    message may quote the model it asked for)."""
    fields: dict[str, object] = {"method": request.method, "path": request.path,
                                 "status": error.status}
    request_id = error.headers.get("X-Request-Id")
    if request_id is not None:
        fields["request_id"] = request_id
    if request.remote is not None:
        fields["client"] = request.remote
    if error.code is not None:
        fields["error_code"] = error.code
    fields["message"] = error.message
    return json_text(fields)


def log_error(logger: logging.Logger, request: web.BaseRequest, error: GatewayError) -> None:
    level = error_level(error)
    if logger.isEnabledFor(level):  # the line is built only when it is written
        logger.log(level, "%s", error_line(request, error))


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Render every failure OpenAI-shaped, log it once, stamp Server-Timing on the way out."""
    timing = RequestTimings()
    request[TIMING_KEY] = timing
    unexpected = False
    try:
        response = await handler(request)
    except GatewayError as exc:
        # Rendered below and then forgotten. Its traceback and cause hold the frames of
        # the steps that raised it, and they the request's context, which refers back
        # to the error: a cycle only the garbage collector would free.
        exc.__traceback__ = exc.__cause__ = exc.__context__ = None
        error = exc
    except web.HTTPException as exc:
        if exc.status < 400:  # redirects and the like are not errors
            raise
        error = _from_http_exception(exc, request)
    except Exception:  # the one place that sees unexpected failures
        error = InternalError("The gateway failed to process the request; it has been logged.")
        log.exception("%s", error_line(request, error))  # its one line, with the traceback
        unexpected = True
    else:
        if not response.prepared:
            response.headers["Server-Timing"] = timing.server_timing()
        return response
    if not unexpected:
        log_error(log, request, error)
    rendered = error.to_response()
    rendered.headers["Server-Timing"] = timing.server_timing()
    if error.ends_connection:
        # Sent now and the connection closed behind it: aiohttp would otherwise linger,
        # reading what is left of a body that has stopped coming (`lingering_time`).
        await rendered.prepare(request)
        await rendered.write_eof()
        request.protocol.force_close()
    return rendered
