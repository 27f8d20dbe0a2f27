"""`WholeResponse`: a response whose status, headers and body are all known before it is
sent (a relayed JSON reply, an error), written to the socket in one piece.

aiohttp's `web.Response` sends such a reply in several Python steps: `prepare` works
out keep-alive, chunking, compression and the default headers, serialises the header
block into the writer's buffer, and `write_eof` joins it with the body and writes.
For a reply that needs none of that machinery this module builds the status line and
the header block and hands them to the writer with the body in one write, from
`prepare`: 2.2–2.8 % fewer instructions per proxied request than `web.Response`
(docs/benchmarks.md, "aiohttp's private parts"). What it takes of aiohttp's insides is
in `gateway.compat.aiohttp`, checked against the installed release at start-up.

The bytes on the wire are what `web.Response` would send for the same status, headers
and body — the same header order, `Content-Length`, `Date`, `Server`, a default
`Content-Type` and `Connection: close` when the connection will not be kept —
and `tests/gateway/test_whole_response.py` compares the two byte for byte. Anything
the fast path does not cover takes aiohttp's own path unchanged: HTTP/1.0, HEAD, a
status that has no body (1xx, 204, 304), cookies, compression or chunking asked for,
a Content-Length set by hand.
"""

from __future__ import annotations

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter

from gateway.compat.aiohttp import (
    SERVER_SOFTWARE,
    must_be_empty_body,
    one_write_start,
    rfc822_formatted_time,
    run_prepare_hook,
    write_whole,
)


class WholeResponse(web.StreamResponse):
    """`web.Response(status=, body=, headers=)` for a body of bytes, sent in one write."""

    def __init__(self, *, status: int = 200, body: bytes = b"",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(status=status, headers=headers)
        self._whole_body = body
        self._sent_whole = False

    @property
    def body(self) -> bytes:
        return self._whole_body

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self._sent_whole:  # sent by the pipeline; aiohttp asks again as the handler ends
            return None
        if self.prepared:  # aiohttp's answer: the writer, or None once finished
            return await super().prepare(request)
        start = one_write_start(request, self)
        if start is None:
            return await self._prepare_as_aiohttp(request)
        writer, keep_alive = start
        body = self._whole_body
        headers = self.headers
        # The headers `web.Response` adds, in its order, before the prepare hook.
        headers[hdrs.CONTENT_LENGTH] = str(len(body))
        if body and hdrs.CONTENT_TYPE not in headers:
            headers[hdrs.CONTENT_TYPE] = "application/octet-stream"
        if hdrs.DATE not in headers:
            headers[hdrs.DATE] = rfc822_formatted_time()
        if hdrs.SERVER not in headers:
            headers[hdrs.SERVER] = SERVER_SOFTWARE
        if not keep_alive and hdrs.CONNECTION not in headers:
            headers[hdrs.CONNECTION] = "close"
        await run_prepare_hook(request, self)  # on_response_prepare receivers
        write_whole(writer, self, headers, body)
        self._sent_whole = True
        return writer

    async def _prepare_as_aiohttp(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        """What `web.Response.prepare` does; `write_eof` then sends the body."""
        # as `web.Response._start`: Content-Length for a body (not for HEAD or 304)
        if hdrs.CONTENT_LENGTH not in self.headers and (
                self._whole_body or (self.status != 304 and request.method != hdrs.METH_HEAD)):
            self.headers[hdrs.CONTENT_LENGTH] = str(len(self._whole_body))
        return await super().prepare(request)

    async def write_eof(self, data: bytes = b"") -> None:
        if self._sent_whole:  # the fast path sent everything from `prepare`
            return
        assert not data, "the body is given to the constructor"
        await super().write_eof(b"" if must_be_empty_body(self) else self._whole_body)
