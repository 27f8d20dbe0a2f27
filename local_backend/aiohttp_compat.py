"""Every part of aiohttp the local backend uses that aiohttp does not publish, in one
place, and the check that the installed aiohttp still has them (`check_aiohttp`).

The backend's server answers malformed HTTP in OpenAI's shape (`server/runner.py`); for
that it needs the runner's server factory (`HookedAppRunner`), the class of the
connections that server makes (`make_connections_with`, whose handler overrides
`handle_error`) and the exceptions aiohttp's parser raises. The gateway keeps its own
copy of the first two in `gateway/compat/aiohttp.py`: the backend is a separate program
that imports nothing of the gateway.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, BadHttpMethod, LineTooLong

__all__ = ["BadHttpMessage", "BadHttpMethod", "HookedAppRunner", "IncompatibleAiohttp",
           "LineTooLong", "check_aiohttp", "make_connections_with"]

_NEEDED: tuple[tuple[object, str], ...] = (
    (web.AppRunner, "_make_server"),
    *((web.Server, name) for name in ("_loop", "_kwargs")),
    (web.RequestHandler, "handle_error"),
)


class IncompatibleAiohttp(RuntimeError):
    """The installed aiohttp lacks a private name the backend's server relies on."""


def check_aiohttp() -> None:
    """Raise `IncompatibleAiohttp` naming each private name the installed aiohttp lacks."""
    missing = [f"{getattr(holder, '__qualname__', holder)}.{name}"
               for holder, name in _NEEDED if not _has(holder, name)]
    if missing:
        raise IncompatibleAiohttp("the installed aiohttp lacks " + ", ".join(missing))


def _has(holder: object, name: str) -> bool:
    if hasattr(holder, name):
        return True
    for cls in getattr(holder, "__mro__", ()):
        if name in (getattr(cls, "__slots__", None) or ()):
            return True
        for member in vars(cls).values():
            if name in getattr(getattr(member, "__code__", None), "co_names", ()):
                return True
    return False


class HookedAppRunner(web.AppRunner):
    """`web.AppRunner` that hands the server it builds to `server_built` before any
    connection opens."""

    async def _make_server(self) -> web.Server:
        return self.server_built(await super()._make_server())

    def server_built(self, server: web.Server) -> web.Server:
        return server


class _ConnectionsServer(web.Server):
    make_handler: Callable[..., web.RequestHandler]

    def __call__(self) -> web.RequestHandler:  # what `web.Server.__call__` builds, made here
        return self.make_handler(self, loop=self._loop, **self._kwargs)


def make_connections_with(server: web.Server,
                          make_handler: Callable[..., web.RequestHandler]) -> None:
    """Each connection `server` accepts from now on is `make_handler(server, loop=…,
    **server's handler options)` instead of a plain `RequestHandler`."""
    server.__class__ = _ConnectionsServer
    cast(_ConnectionsServer, server).make_handler = make_handler
