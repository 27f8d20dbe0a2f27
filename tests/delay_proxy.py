"""A TCP proxy on loopback that delays every chunk, each way: a far-away (slow) Redis
made of a real one, switchable between fast and slow while a test runs.

    proxy = DelayProxy(redis_server.port)
    await proxy.start()             # proxy.url: redis://127.0.0.1:PORT/0
    proxy.delay_s = 0.2             # every chunk now arrives 200 ms after it was sent
    ...
    await proxy.stop()

A chunk read from one side is written to the other `delay_s` after it arrived there
(`delay_s` as it was at that moment), in order: a request and its reply cross it twice,
so a round trip takes 2 × `delay_s` more. When either side closes, both are closed, so
a Redis killed behind it looks killed to its clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

CHUNK = 65536


class DelayProxy:
    def __init__(self, target_port: int, delay_s: float = 0.0) -> None:
        self.target_port = target_port
        self.delay_s = delay_s
        self.port = 0
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._link, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:  # each link then ends as if its peers had closed
            writer.close()
        await asyncio.gather(*self._links, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _link(self, client_reader: asyncio.StreamReader,
                    client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._links.add(task)
        self._writers.add(client_writer)
        try:
            try:
                target_reader, target_writer = await asyncio.open_connection(
                    "127.0.0.1", self.target_port)
            except OSError:
                return  # nothing there (a killed Redis): the client sees its connection close
            self._writers.add(target_writer)
            try:
                await asyncio.gather(self._pipe(client_reader, target_writer),
                                     self._pipe(target_reader, client_writer))
            finally:
                target_writer.close()
                self._writers.discard(target_writer)
        finally:
            client_writer.close()
            self._writers.discard(client_writer)
            self._links.discard(task)

    async def _pipe(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        """Copy one direction, each chunk held until `delay_s` after it arrived; closes
        `sink` at the end (the other direction then ends too)."""
        due: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def deliver() -> None:
            while (item := await due.get()) is not None:
                at, data = item
                if (wait := at - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                sink.write(data)
                await sink.drain()

        delivering = asyncio.ensure_future(deliver())
        try:
            with contextlib.suppress(ConnectionError):
                while data := await source.read(CHUNK):
                    due.put_nowait((time.monotonic() + self.delay_s, data))
                    if delivering.done():
                        break  # the other side went away
            due.put_nowait(None)
            with contextlib.suppress(ConnectionError):
                await delivering
        finally:
            delivering.cancel()
            sink.close()
