"""The HTTP client's exceptions, mapped once onto the failure kinds of
`gateway.core.failures` (the adapter's sends and the relay's reads of an upstream body)."""

from __future__ import annotations

import ssl

import aiohttp

from gateway.compat.aiohttp import MalformedResponse as MalformedHttp
from gateway.core.failures import (
    ConnectRefused,
    ConnectTimeout,
    MalformedResponse,
    PoolTimeout,
    ReadTimeout,
    ResponseTooLarge,
    TlsRejected,
    UpstreamClosed,
    UpstreamFailure,
)
from gateway.upstream.http1_errors import BodyTooLarge, ConnectFailed, ConnectTimedOut, PoolTimedOut

# What reading an answer's body raises (`read_failure` maps each).
READ_ERRORS = (TimeoutError, aiohttp.ClientError)


def send_failure(backend: str, exc: BaseException) -> UpstreamFailure:
    """What an exception of the HTTP client while sending a request and waiting for
    the answer's head means."""
    if isinstance(exc, TimeoutError):
        kind = (ConnectTimeout if isinstance(exc, ConnectTimedOut)
                else PoolTimeout if isinstance(exc, PoolTimedOut) else ReadTimeout)
        return kind(f"Backend '{backend}' did not respond in time "
                    f"({exc.__class__.__name__}).")
    if isinstance(exc, ConnectFailed):
        if isinstance(exc.os_error, ssl.SSLCertVerificationError):
            return TlsRejected(f"Backend '{backend}' failed TLS verification: "
                               f"{exc.os_error.verify_message}.")
        return ConnectRefused(f"Backend '{backend}' is unreachable: {exc.os_error}.")
    message = f"Backend '{backend}' failed: {exc.__class__.__name__}: {exc}."
    return (MalformedResponse if isinstance(exc, MalformedHttp) else UpstreamClosed)(message)


def read_failure(exc: BaseException, message: str) -> UpstreamFailure:
    """What an exception while reading an answer's body means (`message` says where)."""
    if isinstance(exc, TimeoutError):
        return ReadTimeout(message)
    if isinstance(exc, BodyTooLarge):
        return ResponseTooLarge(message)
    if isinstance(exc, MalformedHttp):
        return MalformedResponse(message)
    return UpstreamClosed(message)
