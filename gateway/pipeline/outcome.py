"""What the client is told when no candidate answered: every failure summed up in one
error, with the status the failures call for (a 400 when every backend said it cannot
do what was asked, a 429 when each was rate-limited, a 504 once the budget ran out)."""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from gateway.core.context import RequestContext
from gateway.core.errors import (
    BadRequest,
    DeadlinePassed,
    GatewayError,
    NoBackendAvailable,
    RateLimited,
)
from gateway.core.failures import RateLimited as BackendRateLimited
from gateway.core.failures import UpstreamFailure


def exhausted(ctx: RequestContext, failures: Sequence[UpstreamFailure],
              unavailable: Sequence[str]) -> GatewayError:
    """What the client is told when no candidate answered: the failures, in one error."""
    model = ctx.record.requested_model
    if not failures:
        return NoBackendAvailable(
            f"No backend can serve '{model}': " + "; ".join(unavailable) + ".")
    summary = "; ".join(_describe(failure) for failure in failures)
    last = failures[-1]
    if last.cannot is not None and all(failure.cannot for failure in failures):
        # every backend tried said it cannot do this: the client's to change (400)
        return BadRequest(f"No backend for '{model}' can serve this request as "
                          f"written: {summary}", param=last.cannot.param,
                          code=last.cannot.code)
    if len(failures) > 1 or unavailable:
        summary = f"All candidates for '{model}' failed: {summary}" + (
            "; " + "; ".join(unavailable) if unavailable else "")
    if all(isinstance(failure, BackendRateLimited) for failure in failures):
        headers = {}
        for failure in reversed(failures):  # the latest advice any of them gave
            if "Retry-After" in failure.headers:
                headers["Retry-After"] = failure.headers["Retry-After"]
                break
        return RateLimited(summary, headers=headers)
    return last.client_error(summary)


def deadline_exceeded(ctx: RequestContext, skipped: Sequence[str]) -> DeadlinePassed:
    record = ctx.record
    tried = "; ".join(f"{attempt.key} ({(attempt.error or '').rstrip('.')})"
                      for attempt in record.attempts)
    text = ("The request's latency budget ran out before any backend answered "
            f"'{record.requested_model}'")
    text += f"; tried {tried}" if tried else "; nothing was tried"
    if skipped:
        text += "; not tried " + "; ".join(skipped)
    return DeadlinePassed(text + ".")


def _describe(failure: UpstreamFailure) -> str:
    text = failure.message.rstrip(".")
    if failure.body:
        try:
            message = orjson.loads(failure.body)["error"]["message"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            message = None
        if isinstance(message, str):
            text += f" ({message[:200]})"
    return text
