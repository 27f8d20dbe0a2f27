"""Graceful drain: what a gateway process does between SIGTERM and its exit.

    SIGTERM ─► /readyz 503 at once ─► still serving for `server.drain.announce_s`
            ─► listener closed, idle keep-alive connections closed
            ─► requests in flight finish, for up to `server.drain.timeout_s`
            ─► the ones still running are cut: a stream ends with an error event
               (`server_shutting_down`), never silently; the process exits

A second SIGTERM (or SIGINT) during any of it skips what is left. `Drain` is the
state the app shares (read by `/readyz`, told of every proxied request as an
observer); `drain_and_stop` is the sequence `routegate serve` runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from aiohttp import web

from gateway.core.attempt_facts import Attempt
from gateway.core.context import RequestContext
from gateway.core.errors import ShuttingDown

log = logging.getLogger("routegate.drain")

# The message a cut request's task is cancelled with: the relay tells this cancellation
# (end the stream with an error event) from a client that went away (nobody to tell).
DRAIN_TIMEOUT = "routegate: drain timeout"
# After the cut, how long the cut handlers get to write their error events and finish.
CUT_GRACE_S = 2.0


class Drain:
    """Whether the process is draining, and the proxied requests still running."""

    def __init__(self) -> None:
        self.draining = False
        self._running: set[asyncio.Task[object]] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        return len(self._running)

    def begin(self) -> None:
        self.draining = True

    # `Observer`: the pipeline calls these from the request's own task (`request.task`).
    def request_started(self, ctx: RequestContext) -> None:
        self._running.add(ctx.request.task)
        self._idle.clear()

    def attempt_finished(self, ctx: RequestContext, attempt: Attempt) -> None:
        return None

    def request_finished(self, ctx: RequestContext) -> None:
        self._running.discard(ctx.request.task)
        if not self._running:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()

    def cut(self) -> int:
        """Cancel every request still running (with `DRAIN_TIMEOUT`); how many."""
        running = list(self._running)
        for task in running:
            task.cancel(DRAIN_TIMEOUT)
        return len(running)


DRAIN = web.AppKey("routegate.drain", Drain)


def is_drain_cut(exc: asyncio.CancelledError) -> bool:
    return bool(exc.args) and exc.args[0] == DRAIN_TIMEOUT


def drain_cut_error() -> ShuttingDown:
    return ShuttingDown("The gateway is shutting down and its drain timeout ended this "
                        "response before the backend finished; retry the request.")


async def drain_and_stop(runner: web.AppRunner, drain: Drain, *, announce_s: float,
                         timeout_s: float, hurry: asyncio.Event) -> None:
    """From the first SIGTERM to a stopped runner. `hurry` (a second signal) skips
    the waits that are left."""
    drain.begin()
    log.info("draining: /readyz now answers 503; still serving for %gs", announce_s)
    await _wait_unless(hurry, asyncio.sleep(announce_s))
    for site in list(runner.sites):
        await site.stop()  # no new connections
    server = runner.server
    if server is not None:
        # idle keep-alive ones close now (a request sent on one is not left unanswered),
        # busy ones after their response (gateway.compat.aiohttp's `pre_shutdown`)
        server.pre_shutdown()
    if drain.in_flight:
        log.info("listener closed; %d request(s) in flight get up to %gs", drain.in_flight,
                 timeout_s)
        await _wait_unless(hurry, drain.wait_idle(), timeout_s)
    if drain.in_flight:
        log.warning("drain timeout: ending %d request(s) still running", drain.cut())
        await _wait_unless(hurry, drain.wait_idle(), CUT_GRACE_S)
    await runner.cleanup()


async def _wait_unless(hurry: asyncio.Event, step: Coroutine[Any, Any, object],
                       timeout_s: float | None = None) -> None:
    """Run `step` for at most `timeout_s` unless `hurry` is set first. (`asyncio.wait`,
    not `wait_for`: 3.11's `wait_for` can lose a cancellation that arrives as it ends.)"""
    work = asyncio.ensure_future(step)
    interrupt = asyncio.ensure_future(hurry.wait())
    try:
        await asyncio.wait({work, interrupt}, timeout=timeout_s,
                           return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, interrupt):
            task.cancel()
        await asyncio.gather(work, interrupt, return_exceptions=True)
