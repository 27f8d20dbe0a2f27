"""What the HTTP/1.1 backend client raises beyond aiohttp's own errors: the failures
`gateway/upstream/failures.py` maps onto the failure kinds."""

from __future__ import annotations

from aiohttp import ClientConnectionError, ClientPayloadError, ServerTimeoutError


class ConnectFailed(ClientConnectionError):
    """The backend could not be connected to; `os_error` says why."""

    def __init__(self, address: str, os_error: OSError) -> None:
        super().__init__(f"cannot connect to {address}: {os_error}")
        self.os_error = os_error


class ConnectTimedOut(ServerTimeoutError):
    """The connection did not open within `connect_s`."""


class PoolTimedOut(ServerTimeoutError):
    """No free connection within `pool_wait_s`."""


class BodyTooLarge(ClientPayloadError):
    """A response body over the reader's bound; the connection is not reusable."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"response body over {max_bytes} bytes")
        self.max_bytes = max_bytes
