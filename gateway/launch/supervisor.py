"""Starts the backends a policy marks `launch:` as child processes and keeps them up.

For each such backend: pick a free loopback port, run
`<launch_command> --model M --host 127.0.0.1 --port P <args>`, poll `GET /health`
until it answers (at most `startup_timeout_s`; a local_backend listens only once it has
loaded and warmed up), read what it can do, and the rates it measured, from its
`GET /v1/models`, then hand `http://127.0.0.1:P/v1` and those capabilities to the
upstream pool (routing sends the child only requests it can serve). When the child
dies it is marked down (requests get a 503 naming it) and started again after a backoff
that doubles up to a cap and resets once a child has stayed up for a minute. On
shutdown every child gets SIGTERM, then SIGKILL. A reloaded policy is followed
(`follow`): added `launch:` backends start, removed ones stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from gateway.settings import Settings
from policies.capabilities import ModelCapabilities, from_report
from policies.load import Policy
from policies.schema import LaunchSpec


def child_names(name: str, replicas: int) -> list[str]:
    """A backend's children: its own name for one, `name#i` for each of several."""
    return [name] if replicas <= 1 else [f"{name}#{i}" for i in range(replicas)]

log = logging.getLogger("routegate.supervisor")

HEALTH_POLL_S = 0.1
STOP_GRACE_S = 5.0
STABLE_AFTER_S = 60.0  # a child up this long resets the restart backoff


@dataclass(slots=True)
class Child:
    """What the supervisor knows about one backend's process (read by /readyz, tests)."""

    name: str
    pid: int | None = None
    url: str | None = None
    starts: int = 0
    last_error: str | None = None


class LaunchedBackends(Protocol):
    """Who is told where each child serves: the upstream pool, or (`serve --workers`)
    the board the workers read (`gateway/launch/board.py`)."""

    def set_launched(self, name: str, url: str,
                     capabilities: ModelCapabilities | None = None) -> None: ...

    def set_down(self, name: str, reason: str) -> None: ...


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Supervisor:
    def __init__(self, policy: Policy, pool: LaunchedBackends, settings: Settings) -> None:
        self.policy = policy
        self.pool = pool
        self.settings = settings
        self.children: dict[str, Child] = {}
        self._running: dict[str, tuple[asyncio.Task[None], LaunchSpec]] = {}
        self._stopping: set[asyncio.Task[None]] = set()  # dropped by a reload, exiting
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0))
        self.follow(self.policy)

    def follow(self, policy: Policy) -> None:
        """Bring the children in line with `policy` (a `LivePolicy.on_swap` listener):
        start the `launch:` backends it adds, stop the ones it drops, restart one whose
        `launch:` changed (after the old child has exited: both may not fit on the
        accelerator), and leave the unchanged ones running."""
        self.policy = policy
        if self._http is None:  # not started (supervision off), or stopped
            return
        # a backend with `replicas: N` is N children, `name#0` … (gateway/route/replica_launch)
        wanted = {child: backend.launch for name, backend in policy.file.backends.items()
                  if backend.launch is not None and backend.enabled
                  for child in child_names(name, backend.launch.replicas)}
        stopped: dict[str, asyncio.Task[None]] = {}
        for name, (task, launch) in list(self._running.items()):
            if wanted.get(name) == launch:
                continue
            del self._running[name]
            task.cancel()  # its child gets SIGTERM, then SIGKILL, as at shutdown
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
            stopped[name] = task
            if name not in wanted:
                self.children.pop(name, None)
                self.pool.set_down(name, f"local backend '{name}' was removed from the policy")
                log.info("local backend '%s' removed from the policy; stopping it", name)
        for name, launch in wanted.items():
            if name in self._running:
                continue
            self.children[name] = Child(name)
            self.pool.set_down(name, f"local backend '{name}' is starting")
            task = asyncio.create_task(self._keep_running(name, launch, after=stopped.get(name)),
                                       name=f"supervise-{name}")
            self._running[name] = (task, launch)

    async def stop(self) -> None:
        tasks = [task for task, _ in self._running.values()] + list(self._stopping)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._running.clear()
        self._stopping.clear()
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def _keep_running(self, name: str, launch: LaunchSpec, *,
                            after: asyncio.Task[None] | None = None) -> None:
        if after is not None:  # the child this one replaces is still exiting
            await asyncio.wait([after])
        first_delay, max_delay = self.settings.restart_backoff_s
        delay = first_delay
        child = self.children[name]
        while True:
            started = time.monotonic()
            reason = await self._run_once(child, launch)
            if time.monotonic() - started > STABLE_AFTER_S:
                delay = first_delay
            child.last_error = reason
            self.pool.set_down(name, f"local backend '{name}' is down ({reason})")
            log.error("local backend '%s' %s; restarting in %.1fs", name, reason, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_delay)

    async def _run_once(self, child: Child, launch: LaunchSpec) -> str:
        """Run one child until it dies; the reason it is not serving."""
        port = free_port()
        command = [*self.settings.launch_command, "--model", launch.model,
                   "--host", "127.0.0.1", "--port", str(port), *launch.args]
        if launch.replicas > 1 and "--threads" not in launch.args:
            # replicas share the machine's cores rather than each taking all of them
            command += ["--threads", str(max(1, (os.cpu_count() or 1) // launch.replicas))]
        try:
            process = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.DEVNULL)
        except OSError as exc:
            return f"could not be started ({' '.join(command)}): {exc}"
        child.pid, child.starts = process.pid, child.starts + 1
        try:
            base = f"http://127.0.0.1:{port}"
            if not await self._wait_healthy(process, base + "/health", launch.startup_timeout_s):
                if process.returncode is not None:
                    return (f"exited with code {process.returncode} before answering /health "
                            f"(command: {' '.join(command)})")
                return f"did not answer /health within {launch.startup_timeout_s:g}s"
            url = base + "/v1"
            capabilities = await self._capabilities(url + "/models")
            child.url = url
            self.pool.set_launched(child.name, url, capabilities)
            log.info("local backend '%s' is up at %s (pid %d)", child.name, child.url,
                     process.pid)
            code = await process.wait()
            return f"exited with code {code}"
        finally:
            child.url = None
            await _stop(process)

    async def _capabilities(self, url: str) -> ModelCapabilities | None:
        """What the child's first model card says it can do; None when it says nothing."""
        assert self._http is not None
        try:
            async with self._http.get(url) as response:
                listing = await response.json() if response.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None
        cards = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(cards, list) or not cards or not isinstance(cards[0], dict):
            return None
        return from_report(cards[0])

    async def _wait_healthy(self, process: asyncio.subprocess.Process, url: str,
                            timeout_s: float) -> bool:
        assert self._http is not None
        deadline = time.monotonic() + timeout_s
        while process.returncode is None and time.monotonic() < deadline:
            try:
                async with self._http.get(url) as response:
                    if response.status == 200:
                        return True
            except (TimeoutError, aiohttp.ClientError):
                pass  # not listening yet
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HEALTH_POLL_S):
                    await process.wait()
        return False


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.terminate()
    try:
        async with asyncio.timeout(STOP_GRACE_S):
            await process.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
