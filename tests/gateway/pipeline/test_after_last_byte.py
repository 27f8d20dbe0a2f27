"""Settlement, observers and the record's reporters run after the answer's last byte is
written: a slow one never delays the client (`gateway/pipeline/steps.py`, `finish`).

The gateway runs on the test's event loop; the client is a plain blocking socket in a
thread of its own, so it keeps reading while a slow observer holds the loop.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import orjson
from aiohttp import web

from gateway.app import PLUGINS, create_app
from gateway.core.context import Attempt, RequestContext
from gateway.keys.install import install as install_keys
from gateway.limits.http import install as install_limits
from gateway.plugin import Plugin, Provides, Wiring
from gateway.server.runner import GatewayRunner
from gateway.settings import Settings
from tests.conftest import as_policy, single_backend_policy
from tests.fakes.openai_upstream import Behaviour, FakeOpenAI

SLOW_S = 1.0
BODY = orjson.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n"
           b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(BODY), BODY))


class SlowObserver:
    """Holds the event loop (a blocking call) when told a request finished."""

    def __init__(self) -> None:
        self.finished: list[int] = []

    def request_started(self, ctx: RequestContext) -> None:
        return None

    def attempt_finished(self, ctx: RequestContext, attempt: Attempt) -> None:
        return None

    def request_finished(self, ctx: RequestContext) -> None:
        time.sleep(SLOW_S)
        self.finished.append(ctx.record.status)


class SlowSettlement:
    """An admission whose settlement takes a long round trip (a slow ledger)."""

    def __init__(self) -> None:
        self.settled: list[int] = []

    async def admit(self, ctx: RequestContext) -> SlowSettlement:
        return self

    async def settle(self, ctx: RequestContext) -> None:
        await asyncio.sleep(SLOW_S)
        self.settled.append(ctx.record.status)


def _answer_time(port: int, into: list[float]) -> None:
    """Seconds from sending the request to having the whole answer (the server closes)."""
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(REQUEST)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
            head, _, body = answer.partition(b"\r\n\r\n")
            length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")]
            if length and len(body) >= length[0]:
                break
    into.append(time.perf_counter() - started)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


@contextmanager
def _gateway(plugins: Sequence[Plugin]) -> Iterator[tuple[asyncio.Runner, int]]:
    with asyncio.Runner() as runner:
        upstream = FakeOpenAI(Behaviour())
        runner.run(upstream.start())
        app = create_app(as_policy(single_backend_policy(upstream.url)), Settings(port=0),
                         plugins=plugins)
        server = GatewayRunner(app, access_log=None)

        async def start() -> int:
            await server.setup()
            await web.TCPSite(server, "127.0.0.1", 0).start()
            return int(server.addresses[0][1])

        try:
            yield runner, runner.run(start())
        finally:
            runner.run(server.cleanup())
            runner.run(upstream.stop())


def _timed_request(runner: asyncio.Runner, port: int) -> float:
    took: list[float] = []
    client = threading.Thread(target=_answer_time, args=(port, took))
    client.start()
    runner.run(asyncio.sleep(3 * SLOW_S))  # the server's loop runs while the client reads
    client.join(10)
    assert took, "the client got no whole answer"
    return took[0]


def test_a_slow_observer_does_not_delay_the_answer() -> None:
    observer = SlowObserver()

    def slow_observer(wiring: Wiring) -> Provides:
        return Provides(observers=(observer,))

    with _gateway((*PLUGINS, slow_observer)) as (runner, port):
        took = _timed_request(runner, port)
    assert observer.finished == [200]  # it was told, with the final status
    assert took < SLOW_S / 2, f"the answer waited for the observer: {took:.3f} s"


def test_a_slow_settlement_does_not_delay_the_answer() -> None:
    admission = SlowSettlement()

    def slow_ledger(wiring: Wiring) -> Provides:
        return Provides(admission=admission)

    # the limits' admission (and the managed keys' around it) replaced by a slow one
    plugins = tuple(plugin for plugin in PLUGINS if plugin not in (install_limits, install_keys))
    with _gateway((slow_ledger, *plugins)) as (runner, port):
        took = _timed_request(runner, port)
    assert admission.settled == [200]
    assert took < SLOW_S / 2, f"the answer waited for settlement: {took:.3f} s"
