"""OpenAI-shaped errors: `{"error": {"message", "type", "code", "param"}}` with the right status."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

log = logging.getLogger(__name__)


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = (
            status, message, type_, code, param,
        )
        self.headers = headers or {}

    def body(self) -> dict[str, str | None]:
        return {"message": self.message, "type": self.type, "code": self.code,
                "param": self.param}

    def response(self) -> web.Response:
        return web.json_response({"error": self.body()}, status=self.status,
                                 headers=self.headers)


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, code="invalid_request", param=param)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return ApiError(exc.status, exc.reason, type_="invalid_request_error").response()
    except Exception:  # the one place that turns a bug into a 500 and logs it once
        log.exception("unhandled error in %s %s", request.method, request.path)
        error = ApiError(500, "internal error", type_="server_error", code="internal_error")
        return error.response()
