"""The one trace exporter process of `serve --workers N`, run by the supervisor.

    supervisor ── config, then only end of file ──► export_process FD LISTENER_FD
    worker 0 … N-1: SpanPipe ── connect ──────────► LISTENER (a Unix socket)

The supervisor binds the socket in its private directory (mode 0700: only its user
reaches it) and holds it listening for as long as it runs; each start of the exporter
process is handed it, with a socket pair of its own whose end of file stops the
process (`stop`, once the workers have flushed and exited; a supervisor that dies
stops it too). An exporter process that dies is started again `restart_after_s`
later; the workers' pipes see their connections end, count what the process held as
dropped and connect again. Because the listening socket outlives the process, a
connection made while it was down waits in the socket's backlog for the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pickle
import socket
import sys
from pathlib import Path
from typing import Any

from gateway.telemetry.tracing.frames import CONFIG, frame
from gateway.telemetry.tracing.pipe import RESTART_AFTER_S, STOP_TIMEOUT_S

log = logging.getLogger("routegate.tracing")

BACKLOG = 128  # connections not yet accepted: a few per worker at most


class SharedExporter:
    """`listen()`, then `run()` until `stop()`."""

    def __init__(self, config: dict[str, Any], path: Path, *,
                 restart_after_s: float = RESTART_AFTER_S,
                 command: list[str] | None = None) -> None:
        self._config = config  # the config frame (`ExportProcessSettings.config()`)
        self.path = path
        self._restart_after_s = restart_after_s
        self._command = command or [sys.executable, "-m",
                                    "gateway.telemetry.tracing.export_process"]
        # the process exports what it holds within its export timeout once told to stop
        self._stop_timeout_s = float(config["export"]["timeout_s"]) + STOP_TIMEOUT_S
        self._listener: socket.socket | None = None
        self._owner: socket.socket | None = None  # our end of the running process's pair
        self.process: asyncio.subprocess.Process | None = None
        self.starts = 0
        self._stopping = False
        self._stopped = asyncio.Event()

    def listen(self) -> None:
        """Bind and listen at `path` (raises OSError when it cannot)."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.path))
            listener.listen(BACKLOG)
        except OSError:
            listener.close()
            raise
        self._listener = listener

    async def run(self) -> None:
        """Keep the exporter process running until `stop()`."""
        while not self._stopping:
            process = await self._start()
            if process is not None:
                code = await process.wait()
                self._close_owner()
                if self._stopping:
                    return
                log.error("trace exporter process (pid %d) exited with code %s; starting "
                          "it again in %.1fs", process.pid, code, self._restart_after_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._restart_after_s):
                    await self._stopped.wait()

    async def _start(self) -> asyncio.subprocess.Process | None:
        assert self._listener is not None, "listen() first"
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = (theirs.fileno(), self._listener.fileno())
        try:
            process = await asyncio.create_subprocess_exec(
                *self._command, *map(str, fds), pass_fds=fds,
                stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            mine.close()
            log.error("trace exporter process could not start (%s); trying again in %.1fs",
                      exc, self._restart_after_s)
            return None
        finally:
            theirs.close()
        # a fresh socket pair's buffer takes the config (a few hundred bytes) at once
        mine.sendall(frame(CONFIG, pickle.dumps(self._config)))
        self.process, self._owner = process, mine
        self.starts += 1
        if self._stopping:  # stopped while it started: it sees end of file at once
            self._close_owner()
        return process

    def _close_owner(self) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:
            owner.close()

    async def stop(self) -> None:
        """End of file to the process (it exports what it has and exits), waited for
        up to its export timeout and then some; then the socket goes."""
        self._stopping = True
        self._stopped.set()
        self._close_owner()
        process = self.process
        if process is not None and process.returncode is None:
            try:
                async with asyncio.timeout(self._stop_timeout_s):
                    await process.wait()
            except TimeoutError:
                log.warning("trace exporter process (pid %d) did not stop in %.0fs; "
                            "killed", process.pid, self._stop_timeout_s)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
