"""The launched local backends, shared by the workers of `serve --workers N`.

The supervisor process starts `launch:` backends once (`gateway/launch/supervisor.py`) and
writes where each one is (its URL, or why it is down) to one small JSON file,
replaced atomically on every change (`LaunchBoard`). Each worker reads the file
when it changes (`follow_board`) and tells its upstream pool, as the supervisor
would in a single process: a worker never starts a backend of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from gateway.launch.supervisor import LaunchedBackends
from policies.capabilities import ModelCapabilities

log = logging.getLogger("routegate.workers")

POLL_S = 0.2  # how soon a worker sees a backend come up or go down


class LaunchBoard:
    """The supervisor's side: what `Supervisor` would tell a pool, written to `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._state: dict[str, dict[str, Any]] = {}
        self._write()

    def set_launched(self, name: str, url: str,
                     capabilities: ModelCapabilities | None = None) -> None:
        self._state[name] = {"url": url, "capabilities": None if capabilities is None
                             else dataclasses.asdict(capabilities)}
        self._write()

    def set_down(self, name: str, reason: str) -> None:
        self._state[name] = {"down": reason}
        self._write()

    def _write(self) -> None:
        partial = self.path.with_suffix(".partial")
        partial.write_bytes(orjson.dumps(self._state))
        os.replace(partial, self.path)  # a reader sees the old file or the new one


def apply_board(data: bytes, pool: LaunchedBackends) -> None:
    for name, state in orjson.loads(data).items():
        if "url" in state:
            reported = state.get("capabilities")
            pool.set_launched(name, state["url"],
                              None if reported is None else ModelCapabilities(**reported))
        else:
            pool.set_down(name, state["down"])


async def follow_board(path: Path, pool: LaunchedBackends, *,
                       poll_s: float = POLL_S) -> None:
    """Apply the board to `pool` now and whenever it changes, until cancelled."""
    seen: bytes | None = None
    while True:
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except OSError as exc:  # the supervisor is gone or restarting it: keep what we had
            log.warning("cannot read the launched backends' board %s: %s", path, exc)
        else:
            if data != seen:
                apply_board(data, pool)
                seen = data
        await asyncio.sleep(poll_s)


def board_context(path: Path, pool: LaunchedBackends
                  ) -> Callable[[web.Application], contextlib.AbstractAsyncContextManager[None]]:
    """An `app.cleanup_ctx` entry following the board for the app's lifetime."""

    @contextlib.asynccontextmanager
    async def context(_app: web.Application) -> AsyncIterator[None]:
        apply_board(await asyncio.to_thread(path.read_bytes), pool)  # before any request
        task = asyncio.create_task(follow_board(path, pool), name="launch-board")
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    return context
