"""Real `local_backend` replicas (the demo model) as child processes, for fleet tests."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.ports import free_port

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class LocalReplica:
    process: asyncio.subprocess.Process
    url: str  # http://127.0.0.1:<port>/v1

    @property
    def name(self) -> str:
        return self.url.split("/")[2]

    async def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()

    async def stop(self) -> None:
        """SIGTERM, and SIGKILL if it has not exited 20 s later."""
        if self.process.returncode is None:
            self.process.terminate()
            try:
                async with asyncio.timeout(20):
                    await self.process.wait()
            except TimeoutError:
                await self.kill()


StartReplicas = Callable[..., Awaitable[list[LocalReplica]]]  # (count, *local_backend args)


async def start_local_backend(cache_dir: Path, *args: str,
                              env: dict[str, str] | None = None) -> LocalReplica:
    """`python -m local_backend --model demo` on a free port, once `/health` answers;
    `args` go to its command line, `env` replaces the environment (the cache directory
    is set either way)."""
    port = free_port()
    env = {**(os.environ if env is None else env), "ROUTEGATE_CACHE_DIR": str(cache_dir)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "local_backend", "--model", "demo", "--host", "127.0.0.1",
        "--port", str(port), "--threads", "1", *args, cwd=ROOT, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    async with asyncio.timeout(90), aiohttp.ClientSession() as session:
        while True:
            assert process.returncode is None, "local_backend exited during start-up"
            try:
                async with session.get(f"http://127.0.0.1:{port}/health") as response:
                    if response.status == 200:
                        break
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.1)
    return LocalReplica(process, f"http://127.0.0.1:{port}/v1")


@pytest.fixture
async def start_replicas(tmp_path: Path) -> AsyncIterator[StartReplicas]:
    started: list[LocalReplica] = []

    async def start(count: int, *args: str) -> list[LocalReplica]:
        replicas = await asyncio.gather(*(start_local_backend(tmp_path, *args)
                                          for _ in range(count)))
        started.extend(replicas)
        return list(replicas)

    yield start
    for replica in started:
        await replica.stop()
